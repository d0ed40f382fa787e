"""An experiment, not part of the benchmark: a byte relay between TCP clients
and a Unix-socket backend that moves the backend's bytes to the client with
splice(2) through a pipe (no copy through user space), to measure what
zero-copy forwarding could reach on the stream point of bench/run.sh.

    python3 bench/splice_relay.py PORT /path/to/backend.sock

HTTP passes through as bytes (no parsing, no limits): loopback experiments
only. Stop it by its pid.
"""
import fcntl, os, socket, sys, threading

F_SETPIPE_SZ = 1031
listen_port, backend = int(sys.argv[1]), sys.argv[2]

def up(c, b):
    try:
        while True:
            data = c.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    try: b.shutdown(socket.SHUT_WR)
    except OSError: pass

def down(b, c):
    r, w = os.pipe()
    try: fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
    except OSError: pass
    try:
        while True:
            n = os.splice(b.fileno(), w, 1 << 20)
            if n == 0:
                break
            while n:
                n -= os.splice(r, c.fileno(), n)
    except OSError:
        pass
    try: c.shutdown(socket.SHUT_WR)
    except OSError: pass

def serve(c):
    b = socket.socket(socket.AF_UNIX); b.connect(backend)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = threading.Thread(target=up, args=(c, b), daemon=True); t.start()
    down(b, c)
    c.close(); b.close()

s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", listen_port)); s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
