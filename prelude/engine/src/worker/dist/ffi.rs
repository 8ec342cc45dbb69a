//! Raw bindings to `csrc/c10d_shim.cpp`. Every function that can fail writes a message into
//! the caller's buffer and returns -1 / null; C++ exceptions never cross this boundary.

use std::os::raw::{c_char, c_int, c_void};

#[repr(C)]
pub(super) struct TbStore {
    _private: [u8; 0],
}
#[repr(C)]
pub(super) struct TbPg {
    _private: [u8; 0],
}
#[repr(C)]
pub(super) struct TbWork {
    _private: [u8; 0],
}

extern "C" {
    pub(super) fn tb_have_nccl() -> c_int;
    pub(super) fn tb_store_server(
        host: *const c_char,
        port: u16,
        timeout_ms: i64,
        port_out: *mut u16,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut TbStore;
    pub(super) fn tb_store_free(s: *mut TbStore);
    pub(super) fn tb_store_client(
        host: *const c_char,
        port: u16,
        timeout_ms: i64,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut TbStore;
    pub(super) fn tb_store_set(
        s: *mut TbStore,
        key: *const c_char,
        data: *const u8,
        len: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub(super) fn tb_store_check(
        s: *mut TbStore,
        key: *const c_char,
        exists: *mut c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub(super) fn tb_store_get(
        s: *mut TbStore,
        key: *const c_char,
        out: *mut *mut u8,
        out_len: *mut usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub(super) fn tb_bytes_free(p: *mut u8);
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tb_pg_new(
        backend: *const c_char,
        master_addr: *const c_char,
        port: u16,
        rank: c_int,
        world: c_int,
        is_server: c_int,
        timeout_ms: i64,
        gloo_ifname: *const c_char,
        gloo_host: *const c_char,
        store_prefix: *const c_char,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut TbPg;
    pub(super) fn tb_pg_free(p: *mut TbPg);
    pub(super) fn tb_pg_set_backend(
        p: *mut TbPg,
        device_type: c_int,
        backend: *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub(super) fn tb_pg_rank(p: *const TbPg) -> c_int;
    pub(super) fn tb_pg_size(p: *const TbPg) -> c_int;
    pub(super) fn tb_pg_allreduce_start(
        p: *mut TbPg,
        tensor: *mut c_void,
        op: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut TbWork;
    pub(super) fn tb_pg_reduce_scatter_start(
        p: *mut TbPg,
        output: *mut c_void,
        input: *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut TbWork;
    pub(super) fn tb_pg_allgather_start(
        p: *mut TbPg,
        output: *mut c_void,
        input: *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> *mut TbWork;
    pub(super) fn tb_work_wait(w: *mut TbWork, err: *mut c_char, errlen: usize) -> c_int;
    pub(super) fn tb_work_free(w: *mut TbWork);
    pub(super) fn tb_pg_allreduce(
        p: *mut TbPg,
        tensors: *const *mut c_void,
        n: usize,
        op: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub(super) fn tb_pg_broadcast(
        p: *mut TbPg,
        tensors: *const *mut c_void,
        n: usize,
        root: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub(super) fn tb_pg_barrier(p: *mut TbPg, err: *mut c_char, errlen: usize) -> c_int;
}
