//! The event loop's mailbox: what reaches a node's driver, from its workers' event streams
//! (local and, on node 0, every other node's, through the rendezvous's collector) and from its
//! local workers' raw output. Its own module: the loop's two rooms (`fold`, `supervise`) and
//! `launch`, which wires the collector and the workers' output into it, all name it.

use super::processes::RawOutput;
use crate::shared::events::Event;

/// What reaches the event loop: a worker's event, or a line of a local worker's raw output.
pub(super) enum Incoming {
    Event(Event),
    Raw(RawOutput),
}
