#!/usr/bin/env python3
"""The rate of one TCP link, without iperf: scripts/netns_cluster.sh's
--check_links runs `serve` in one namespace and `send` in another.

  netns_link_rate.py serve ADDRESS PORT READY_FILE
      accepts one connection on ADDRESS:PORT (writing READY_FILE once it
      listens), reads until the sender closes, and answers
      "BYTES MEASURED SECONDS": the bytes, and the bytes after the first
      read with the time from the first read to the last.
  netns_link_rate.py send ADDRESS PORT BYTES
      sends BYTES bytes to ADDRESS:PORT and prints the receiver's rate in
      Mbit/s (one number).

Every wait is bounded (kTimeoutSeconds); a failure is one line on stderr and
exit 1.
"""
import socket
import sys
import time

kTimeoutSeconds = 60
kChunkBytes = 1 << 20


def serve(address, port, ready_file):
    with socket.create_server((address, port)) as server:
        server.settimeout(kTimeoutSeconds)
        with open(ready_file, "w") as f:
            f.write("ready\n")
        conn, _ = server.accept()
        with conn:
            conn.settimeout(kTimeoutSeconds)
            total = first_bytes = 0
            first = last = None
            while True:
                data = conn.recv(kChunkBytes)
                if not data:
                    break
                now = time.monotonic()
                if first is None:
                    first, first_bytes = now, len(data)
                last = now
                total += len(data)
            seconds = (last - first) if first is not None else 0.0
            conn.sendall(
                f"{total} {total - first_bytes} {seconds:.6f}\n".encode())


def send(address, port, nbytes):
    deadline = time.monotonic() + kTimeoutSeconds
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=5)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot connect to {address}:{port}: {e}")
            time.sleep(0.05)
    with conn:
        conn.settimeout(kTimeoutSeconds)
        chunk = b"\0" * kChunkBytes
        left = nbytes
        while left > 0:
            n = min(left, kChunkBytes)
            conn.sendall(chunk[:n])
            left -= n
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while not reply.endswith(b"\n"):
            data = conn.recv(100)
            if not data:
                break
            reply += data
    received, measured, seconds = reply.split()
    if int(received) != nbytes:
        raise RuntimeError(f"sent {nbytes} bytes, {received} arrived")
    mbit = int(measured) * 8 / max(float(seconds), 1e-6) / 1e6
    print(f"{mbit:.0f}")


def main(argv):
    try:
        if len(argv) == 5 and argv[1] == "serve":
            serve(argv[2], int(argv[3]), argv[4])
        elif len(argv) == 5 and argv[1] == "send":
            send(argv[2], int(argv[3]), int(argv[4]))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (OSError, RuntimeError, ValueError) as e:
        print(f"netns_link_rate.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
