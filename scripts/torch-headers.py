#!/usr/bin/env python3
"""Fetches one torch release's C++ headers (torch/include/ and torch/version.py) from its PyPI
wheel without downloading the wheel: a wheel is a zip, so its central directory is read with an
HTTP range request, then only the byte span holding include/ is fetched and unpacked. Every file
is checked against the wheel's RECORD (sha256). About 20 MB instead of the 500+ MB wheel.

    scripts/torch-headers.py VERSION DEST     # DEST/include, DEST/version.py, DEST/build-version

Idempotent: a DEST whose .complete names VERSION is left as it is. Writes into DEST.tmp and
renames, so an interrupted fetch never leaves a DEST that looks complete.
"""
import base64
import hashlib
import io
import os
import re
import shutil
import sys
import urllib.request
import zipfile

INDEX = os.environ.get("TRAINBOOK_PYPI_SIMPLE", "https://pypi.org/simple")


def die(msg):
    print(f"torch-headers: {msg}", file=sys.stderr)
    sys.exit(1)


def wheel_url(version):
    """The URL of a manylinux x86_64 wheel of torch==VERSION (any CPython: headers are the same)."""
    try:
        with urllib.request.urlopen(f"{INDEX}/torch/", timeout=60) as r:
            page = r.read().decode()
    except OSError as e:
        die(f"cannot read {INDEX}/torch/ ({e}): the header check needs PyPI")
    pat = re.compile(r'href="([^"#]*/torch-' + re.escape(version) + r'-cp3\d+-cp3\d+-manylinux[^"#]*x86_64\.whl)')
    urls = pat.findall(page)
    if not urls:
        die(f"PyPI has no manylinux x86_64 wheel of torch {version}")
    return sorted(urls)[-1]


def fetch(url, start, end):
    """Bytes start..end (inclusive) of url."""
    req = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end}"})
    with urllib.request.urlopen(req, timeout=300) as r:
        if r.status != 206:
            die(f"{url} does not answer range requests (HTTP {r.status})")
        return r.read()


class Ranged(io.RawIOBase):
    """A read-only, seekable view of a remote file; only the tail (for the central directory)
    and ranges asked for are fetched."""

    def __init__(self, url):
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=60) as r:
            self.size = int(r.headers["Content-Length"])
        self.url, self.pos, self.cache = url, 0, {}

    def seekable(self):
        return True

    def readable(self):
        return True

    def seek(self, off, whence=0):
        self.pos = {0: off, 1: self.pos + off, 2: self.size + off}[whence]
        return self.pos

    def tell(self):
        return self.pos

    def preload(self, start, end):
        self.cache = {"start": start, "data": fetch(self.url, start, end)}

    def readinto(self, b):
        n = min(len(b), self.size - self.pos)
        if n <= 0:
            return 0
        c = self.cache
        if c and c["start"] <= self.pos and self.pos + n <= c["start"] + len(c["data"]):
            off = self.pos - c["start"]
            b[:n] = c["data"][off:off + n]
        else:
            b[:n] = fetch(self.url, self.pos, self.pos + n - 1)
        self.pos += n
        return n


def main():
    if len(sys.argv) != 3:
        die("usage: torch-headers.py VERSION DEST")
    version, dest = sys.argv[1], sys.argv[2].rstrip("/")
    done = os.path.join(dest, ".complete")
    if os.path.exists(done) and open(done).read().strip() == version:
        return
    url = wheel_url(version)
    print(f"torch-headers: torch {version}: reading the headers out of {url.rsplit('/', 1)[-1]}", file=sys.stderr)
    remote = Ranged(url)
    # The central directory is near the end; a generous tail in one request covers it.
    tail = min(remote.size, 4 << 20)
    remote.preload(remote.size - tail, remote.size - 1)
    z = zipfile.ZipFile(io.BufferedReader(remote, buffer_size=1 << 20))
    wanted = [i for i in z.infolist() if i.filename.startswith("torch/include/") and not i.is_dir()]
    record = [i for i in z.infolist() if i.filename.endswith(".dist-info/RECORD")]
    version_py = z.getinfo("torch/version.py")
    if not wanted or not record:
        die(f"the torch {version} wheel has no torch/include/ or RECORD")
    hashes = {}
    for line in z.read(record[0]).decode().splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            hashes[parts[0]] = parts[1][len("sha256="):]
    # include/ is one contiguous run of the archive in practice; fetch its whole span at once
    # (local headers are 30 bytes plus name and extra field before each member's data).
    infos = wanted + [version_py]
    lo = min(i.header_offset for i in infos)
    hi = max(i.header_offset + 30 + len(i.filename.encode()) + 1024 + i.compress_size for i in infos)
    remote.preload(lo, min(hi, remote.size - 1))
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for info in infos:
        data = z.read(info)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if hashes.get(info.filename) != digest:
            die(f"{info.filename} does not match the wheel's RECORD: fetch again")
        rel = info.filename[len("torch/"):]
        path = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    m = re.search(r"__version__\s*=\s*['\"]([0-9.]+)", open(os.path.join(tmp, "version.py")).read())
    with open(os.path.join(tmp, "build-version"), "w") as f:
        f.write(m.group(1) + "\n")
    os.makedirs(os.path.join(tmp, "lib"), exist_ok=True)
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(version + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    print(f"torch-headers: torch {version}: {len(wanted)} headers in {dest}/include", file=sys.stderr)


if __name__ == "__main__":
    main()
