#!/usr/bin/env python3
"""kill -9 the controller again and again under concurrent clients.

Starts `multislice controller` (no hosts) on a data directory, runs CLIENTS
threads that create, get, list and delete queued resources, and every
0.3-1.0 s kills the controller with SIGKILL and starts it again on the same
data directory and port, KILLS times. Then checks that no record was lost
or half-made: every create that was answered 200 and never deleted exists
and reads back whole; every answer was a 2xx/4xx (never a 5xx); the store
still takes writes.

Usage: bench/controller_kill9.py [--kills 22] [--clients 20] [--binary B]
"""
import argparse, http.client, json, os, random, signal, socket, subprocess
import sys, tempfile, threading, time

PARENT = "/v2alpha1/projects/p/locations/local-a"
BODY = json.dumps({"tpu": {"node_spec": [{"node_id": "n",
    "node": {"accelerator_type": "cpu-2",
             "metadata": {"startup-script": "sleep 1"}}}]}})


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Controller:
    def __init__(self, binary, data, port):
        self.cmd = [binary, "controller", "--port", str(port), "--data-dir",
                    data]
        self.port, self.data, self.proc = port, data, None

    def start(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.02)
        raise SystemExit("the controller did not start")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def call(port, token, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request(method, path, body, {"Authorization": "Bearer " + token,
                                   "Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def client(n, ctl, token, stop, acked, deleted, statuses, lock):
    rng = random.Random(n)
    while not stop.is_set():
        qr = "q%d-%d" % (n, rng.randrange(10**6))
        try:
            s, _ = call(ctl.port, token, "POST",
                        PARENT + "/queuedResources?queued_resource_id=" + qr,
                        BODY)
            with lock:
                statuses[s] = statuses.get(s, 0) + 1
                if s == 200:
                    acked.add(qr)
            s, _ = call(ctl.port, token, "GET", PARENT + "/queuedResources")
            with lock:
                statuses[s] = statuses.get(s, 0) + 1
            if rng.random() < 0.3 and s == 200:
                with lock:  # sent: it may be committed without an answer
                    deleted.add(qr)
                s, _ = call(ctl.port, token, "DELETE",
                            PARENT + "/queuedResources/" + qr + "?force=true")
                with lock:
                    statuses[s] = statuses.get(s, 0) + 1
        except (OSError, http.client.HTTPException):
            time.sleep(0.05)  # the controller is being killed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=22)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--binary", default="build/bin/multislice")
    a = ap.parse_args()
    data = tempfile.mkdtemp(prefix="kill9-")
    ctl = Controller(a.binary, data, free_port())
    ctl.start()
    token = open(os.path.join(data, "token")).read().strip()
    stop, lock = threading.Event(), threading.Lock()
    acked, deleted, statuses = set(), set(), {}
    threads = [threading.Thread(target=client, args=(i, ctl, token, stop,
               acked, deleted, statuses, lock)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for k in range(a.kills):
        time.sleep(random.uniform(0.3, 1.0))
        ctl.kill9()
        ctl.start()
    stop.set()
    for t in threads:
        t.join()
    lost, broken = [], []
    for qr in sorted(acked - deleted):
        s, body = call(ctl.port, token, "GET", PARENT + "/queuedResources/" + qr)
        if s == 404:
            lost.append(qr)
        elif s != 200 or "state" not in json.loads(body):
            broken.append(qr)
    s, _ = call(ctl.port, token, "POST",
                PARENT + "/queuedResources?queued_resource_id=after", BODY)
    ctl.kill9()
    five = sum(v for k, v in statuses.items() if k >= 500)
    print("%d kill -9 under %d clients: %d creates acknowledged, %d deletes sent; "
          "answers %s; lost %d, half-made %d, 5xx %d; a write afterwards: %d"
          % (a.kills, a.clients, len(acked), len(deleted),
             dict(sorted(statuses.items())), len(lost), len(broken), five, s))
    sys.exit(0 if not lost and not broken and not five and s == 200 else 1)


if __name__ == "__main__":
    main()
