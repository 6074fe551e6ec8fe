# kernelgate's zygote for Python kernels (see zygote.go for the whole design).
#
# Started by the gateway as `python -c <this file> kernelgate-zygote CONFIG`
# with CONFIG a JSON object {"module", "preload", "socket"}, fd 3 the pipe
# on which it reports "ready" (or why it could not start). It imports the
# kernel module's dependencies and the preload list, checks that it still
# has one thread and no ZeroMQ context, listens on the unix socket and then,
# for each connection from the gateway (and only the gateway: its peer
# credentials are checked), forks one kernel:
#
#   gateway -> zygote  frame {"argv", "env", "cwd", "parent", "die_with_parent"}
#                      with the kernel's stdout/stderr descriptor (SCM_RIGHTS)
#   zygote  -> gateway frame {"pid": N}          (or {"error": ...})
#   gateway -> child   frame {"go": true}        (after cgroup and rlimits)
#   child   -> gateway frame {"ok": true}        (or {"error": ...}), then it
#                      runs the module as `python -m` would.
#
# Frames are a 4-byte big-endian length and a JSON object.
#
# The child is created with clone(CLONE_PARENT): its parent is the gateway,
# not the zygote, so the gateway reaps it, its parent-death signal and
# JPY_PARENT_PID refer to the gateway, and the zygote dying leaves it alone.
# Python's fork protocol is kept (PyOS_BeforeFork/AfterFork_*: the GIL,
# import lock, threading state and os.register_at_fork hooks such as
# random's reseeding), and so is glibc's (the thread's cached tid is set by
# CLONE_CHILD_SETTID as glibc's own fork does). glibc's pthread_atfork
# handlers do not run: they exist to repair locks other threads held at
# fork, and the zygote forks only while it has a single thread.

import ctypes
import gc
import json
import os
import runpy
import signal
import socket
import struct
import sys


class _Zygote:
    CLONE_PARENT = 0x00008000
    CLONE_CHILD_CLEARTID = 0x00200000
    CLONE_CHILD_SETTID = 0x01000000
    PR_SET_PDEATHSIG = 1
    # clone's number and where its child-tid argument goes, by machine:
    # x86_64 (flags, stack, parent_tid, child_tid, tls); arm64 (flags,
    # stack, parent_tid, tls, child_tid).
    CLONE_ABI = {"x86_64": (56, 3), "aarch64": (220, 4)}

    def __init__(self, config):
        self.module = config["module"]
        self.libc = ctypes.PyDLL(None, use_errno=True)  # keeps the GIL held
        self.libc.syscall.restype = ctypes.c_long
        self.libc.pthread_self.restype = ctypes.c_void_p
        self.libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        self.gateway = os.getppid()
        self.listener = None
        self.spares = {}  # pid of a spare child -> the zygote's end of its socket pair
        self.written = []  # runs of pages a kernel writes: see rehearse

    # --- start -----------------------------------------------------------

    def start(self, preload, path):
        import importlib
        import platform

        if sys.version_info < (3, 9):
            raise RuntimeError("Python 3.9 or later is needed")
        machine = platform.machine()
        if machine not in self.CLONE_ABI:
            raise RuntimeError("no clone ABI known for %s" % machine)
        self.sys_clone, self.ctid_arg = self.CLONE_ABI[machine]

        # What `python -m module` imports before the kernel runs, then the
        # kernelspec's list.
        # ipykernel chooses matplotlib's inline backend by MPLBACKEND before
        # matplotlib loads; a preloaded matplotlib must see the same.
        unset = "MPLBACKEND" not in os.environ
        if unset:
            os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        importlib.import_module("ipykernel.kernelapp")
        importlib.import_module("IPython")
        for name in preload:
            importlib.import_module(name)
        if unset:
            del os.environ["MPLBACKEND"]
        self.prepare_kernel_start()
        self.pack_module_names()
        self.quiet_native_threads()
        self.check_alone()
        self.tid_address = self.find_tid_address()
        # Objects made so far are never collected: the collector then never
        # writes to the pages the kernels share with the zygote.
        gc.collect()
        gc.freeze()
        self.rehearse()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)

    def prepare_kernel_start(self):
        """Does once what every kernel's start would do alike, and what
        holds no thread, no descriptor and nothing of a kernel: the modules
        ipykernel imports while it starts, and jupyter_client's list of
        this machine's addresses, which a kernel builds when it reads its
        connection file (trying `ip` and `ifconfig` in subprocesses, then
        resolving host names)."""
        import importlib

        for name in ("faulthandler", "IPython.core.completerlib"):
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        try:
            from jupyter_client import localinterfaces

            localinterfaces.localhost()
        except Exception:  # each kernel then tries on its own
            pass

    def pack_module_names(self):
        """IPython's start takes a set of sys.modules' keys, which writes to
        the reference count of every module name. The names were made one
        by one as the modules were imported, scattered over hundreds of
        pages, so that every kernel copied them all. Here each key is
        replaced by an equal string made now, all of them side by side in
        a few pages; sys.modules keeps its contents and its order."""
        modules = sys.modules
        for name in list(modules):
            key = (name + ".")[:-1] if type(name) is str and len(name) > 1 else name
            modules[key] = modules.pop(name)

    def quiet_native_threads(self):
        # OpenBLAS starts its thread pool when numpy loads it and stops it
        # in its own pthread_atfork handler; stop it now instead. Each
        # kernel starts its pool again on its first threaded BLAS call.
        for lib in ("libopenblas.so.0", "libopenblasp-r0.3.21.so"):
            try:
                getattr(ctypes.PyDLL(lib), "blas_thread_shutdown_")()
                break
            except (OSError, AttributeError):
                continue

    def check_alone(self):
        tasks = os.listdir("/proc/self/task")
        if len(tasks) != 1:
            names = []
            for t in tasks:
                try:
                    with open("/proc/self/task/%s/comm" % t) as f:
                        names.append(f.read().strip())
                except OSError:
                    pass
            raise RuntimeError("%d threads after the imports (%s): a zygote must have one" % (len(tasks), ", ".join(names)))
        zmq = sys.modules.get("zmq")
        if zmq is not None and getattr(zmq.Context, "_instance", None) is not None:
            raise RuntimeError("a ZeroMQ context exists after the imports")

    def find_tid_address(self):
        # glibc caches the thread's tid in its struct pthread; a raw clone
        # must set it in the child as glibc's fork does.
        me = self.libc.pthread_self()
        tid = os.getpid()
        hits = [o for o in range(0, 2048, 4) if ctypes.c_int.from_address(me + o).value == tid]
        if len(hits) != 1:
            raise RuntimeError("cannot locate glibc's cached thread id (%d candidates)" % len(hits))
        return me + hits[0]

    # --- the pages a kernel writes ----------------------------------------

    # The rehearsal. A kernel's start writes to some 5 000 of the pages it
    # shares with the zygote (reference counts, caches, free blocks of the allocators), and
    # each first write is a copy-on-write fault. Taken while the kernel's
    # threads run, each fault also interrupts every other CPU running one of
    # them to flush its TLB: on a virtual machine that was half the CPU time
    # of a start. The pages are nearly the same for every kernel of a
    # zygote, so the zygote learns them once, from a rehearsal, and each
    # child copies them in one go (MADV_POPULATE_WRITE) while it is still
    # alone: a spare while parked, a forked child after its gate. The copies
    # hold the same bytes; they are the pages the kernel would have copied.
    # The rehearsal also reports the regular expressions its start compiled
    # (argparse's, tokenize's, ...): the zygote compiles them into `re`'s
    # cache, where every kernel finds them.
    MADV_POPULATE_WRITE = 23  # Linux 5.14
    REHEARSAL_WAIT = 30  # seconds

    def rehearse(self):
        """Starts an ipykernel in a throwaway child as a kernel starts and
        notes which of the zygote's pages it copied and which regular
        expressions it compiled. A rehearsal that fails only leaves the
        kernels to copy their pages and compile their patterns themselves."""
        import re
        import select
        import shutil
        import tempfile

        self.written = []  # [(address, length)]
        scratch = tempfile.mkdtemp(prefix="rehearsal-")
        r, w = os.pipe()
        pid = 0
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    # Only its own end of the pipe: not the zygote's ready pipe.
                    os.closerange(3, w)
                    os.closerange(w + 1, os.sysconf("SC_OPEN_MAX"))
                    self.libc.prctl(self.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                    patterns = Child.rehearse(scratch)
                    os.write(w, b"ok " + json.dumps(patterns).encode() + b"\n")
                    while True:
                        signal.pause()  # until the zygote has looked
                except BaseException as e:
                    try:
                        os.write(w, ("%s: %s\n" % (type(e).__name__, e)).encode())
                    finally:
                        os._exit(1)
            os.close(w)
            w = -1
            word = b""
            while not word.endswith(b"\n"):
                if not select.select([r], [], [], self.REHEARSAL_WAIT)[0]:
                    word += b" (no answer)\n"
                    break
                more = os.read(r, 1 << 16)
                if not more:
                    word += b" (exited)\n"
                    break
                word += more
            if word.startswith(b"ok ") and word.endswith(b"\n"):
                self.written = self.pages_copied_by(pid)
                for pattern, flags in json.loads(word[3:])[:256]:
                    re.compile(pattern, flags)
                gc.freeze()
            else:
                sys.stderr.write("zygote: rehearsal failed: %s\n" % word.decode(errors="replace").strip())
        except Exception as e:
            sys.stderr.write("zygote: rehearsal failed: %s: %s\n" % (type(e).__name__, e))
        finally:
            if pid > 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            os.close(r)
            if w >= 0:
                os.close(w)
            shutil.rmtree(scratch, ignore_errors=True)

    @staticmethod
    def private_writable(pid="self"):
        """The private writable mappings of a process: [(start, end)]."""
        out = []
        with open("/proc/%s/maps" % pid) as f:
            for line in f:
                addrs, perms = line.split(None, 2)[:2]
                if perms == "rw-p":
                    a, b = addrs.split("-")
                    out.append((int(a, 16), int(b, 16)))
        return out

    def pages_copied_by(self, pid):
        """Runs of the zygote's pages that child pid has copied: present
        here, present and exclusively its own there (/proc/PID/pagemap)."""
        import array

        page = os.sysconf("SC_PAGE_SIZE")
        present, exclusive = 1 << 63, 1 << 56
        runs = []
        with open("/proc/self/pagemap", "rb", buffering=0) as mine, open("/proc/%d/pagemap" % pid, "rb", buffering=0) as theirs:
            for start, end in self.private_writable():
                n = (end - start) // page
                here, there = array.array("Q"), array.array("Q")
                here.frombytes(os.pread(mine.fileno(), n * 8, start // page * 8))
                there.frombytes(os.pread(theirs.fileno(), n * 8, start // page * 8))
                for i in range(min(len(here), len(there))):
                    if here[i] & present and there[i] & (present | exclusive) == present | exclusive:
                        a = start + i * page
                        if runs and runs[-1][0] + runs[-1][1] == a:
                            runs[-1][1] += page
                        else:
                            runs.append([a, page])
        return [tuple(r) for r in runs]

    def copy_written_pages(self):
        """Copies, in this child, the pages a kernel writes (see above)."""
        if not self.written:
            return
        madvise = self.libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        mapped = self.private_writable()
        i = 0
        for a, n in self.written:
            end = a + n
            while i < len(mapped) and mapped[i][1] <= a:
                i += 1
            j = i
            while j < len(mapped) and mapped[j][0] < end:
                lo, hi = max(a, mapped[j][0]), min(end, mapped[j][1])
                if madvise(lo, hi - lo, self.MADV_POPULATE_WRITE) != 0 and ctypes.get_errno() == 22:
                    return  # EINVAL: a kernel without MADV_POPULATE_WRITE
                j += 1

    # --- serving -----------------------------------------------------------

    def serve(self):
        """Serves fork requests; returns, in a child, what it must run."""
        while True:
            conn, _ = self.listener.accept()
            try:
                job = self.serve_one(conn)
            except Exception as e:  # a bad request never ends the zygote
                try:
                    send_frame(conn, {"error": "%s: %s" % (type(e).__name__, e)})
                except OSError:
                    pass
                job = None
            if job is not None:
                return job
            conn.close()

    def serve_one(self, conn):
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", creds)
        if pid != self.gateway or uid != os.geteuid():
            raise PermissionError("fork requests come from the gateway only")
        req, fds = recv_frame(conn, want_fds=1)
        try:
            kind = req.get("kind", "fork")
            if kind == "claim":
                return self.claim(conn, req, fds)
            if kind == "fork":
                if len(fds) != 1:
                    raise ValueError("expected the output descriptor")
                self.check_argv(req["argv"])
            elif kind != "spare":
                raise ValueError("unknown request %r" % kind)
            sys.stdout.flush()
            sys.stderr.flush()
            mine = None
            if kind == "spare":
                mine, theirs = socket.socketpair()
            pid = self.fork()
            if pid == 0:
                try:
                    if kind == "spare":
                        mine.close()
                        return Child.spare(self, theirs, conn, req)
                    return Child(self, conn, fds[0], req)
                except BaseException:
                    os._exit(127)  # never a second zygote
            if kind == "spare":
                theirs.close()
                self.spares[pid] = mine
        finally:
            for fd in fds:
                os.close(fd)
        send_frame(conn, {"pid": pid})
        return None

    def check_argv(self, argv):
        if len(argv) < 3 or argv[1] != "-m" or argv[2] != self.module:
            raise ValueError("this zygote runs `python -m %s` only" % self.module)

    def claim(self, conn, req, fds):
        """Hands a kernel's request, its output and the gateway's
        connection to a spare child, which answers on the connection."""
        if len(fds) != 1:
            raise ValueError("expected the output descriptor")
        self.check_argv(req["argv"])
        mine = self.spares.pop(req.get("pid"), None)
        if mine is None:
            raise LookupError("no spare %s" % req.get("pid"))
        try:
            send_frame(mine, req, fds=[fds[0], conn.fileno()])
        finally:
            mine.close()
        return None

    def fork(self):
        flags = self.CLONE_PARENT | self.CLONE_CHILD_SETTID | self.CLONE_CHILD_CLEARTID | signal.SIGCHLD
        api = ctypes.pythonapi
        api.PyOS_BeforeFork()
        args = [ctypes.c_ulong(flags), ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0)]
        args[self.ctid_arg] = ctypes.c_void_p(self.tid_address)
        pid = self.libc.syscall(ctypes.c_long(self.sys_clone), *args)
        if pid == 0:
            api.PyOS_AfterFork_Child()
            return 0
        err = ctypes.get_errno()
        api.PyOS_AfterFork_Parent()
        if pid < 0:
            raise OSError(err, "clone: " + os.strerror(err))
        return pid


class Child:
    """What a forked child does before it becomes the kernel. A spare
    child does the part that needs no request, then waits to be claimed."""

    @classmethod
    def spare(cls, zygote, sock, request_conn, req):
        cls.detach(zygote, req)
        # The gateway moves a spare into a cgroup of its own and then says
        # so: the pages copied from then on are charged to that cgroup,
        # which becomes the kernel's.
        try:
            parked, _ = recv_frame(request_conn)
        except (OSError, EOFError, ValueError):
            os._exit(0)  # the gateway let it go
        request_conn.close()
        if parked.get("parked"):
            zygote.copy_written_pages()
        try:
            claim, fds = recv_frame(sock, want_fds=2)
        except (OSError, EOFError):
            os._exit(0)  # the zygote or the gateway let it go
        if len(fds) != 2:
            os._exit(125)
        sock.close()
        conn = socket.socket(fileno=fds[1])
        try:
            send_frame(conn, {"pid": os.getpid()})
        except OSError:
            os._exit(125)
        if not claim.get("die_with_parent", True):
            zygote.libc.prctl(zygote.PR_SET_PDEATHSIG, 0, 0, 0, 0)
        child = cls(zygote, conn, fds[0], claim, spare=True)
        os.close(fds[0])
        return child

    @staticmethod
    def detach(zygote, req):
        # Die with the gateway as an exec'd kernel does (Pdeathsig), unless
        # the gateway lets its kernels outlive it.
        # A spare dies with the gateway while parked; a claim that lets the
        # kernel outlive it clears the signal (Child.spare).
        if req.get("die_with_parent", True):
            zygote.libc.prctl(zygote.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != req["parent"]:
                os._exit(1)
        # A session of its own, and so a process group of its own: signals
        # go to the group, and no terminal's hangup or Ctrl-C reaches it.
        os.setsid()
        # Nothing of the zygote's own stays open: its listener, the sockets
        # of its spare children, and (once replaced below) its log; the
        # ready pipe closed at start.
        zygote.listener.close()
        for other in zygote.spares.values():
            other.close()
        zygote.spares.clear()

    def __init__(self, zygote, conn, out, req, spare=False):
        self.module = zygote.module
        self.argv = req["argv"]
        set_cmdline(self.argv)
        if not spare:
            self.detach(zygote, req)
        os.dup2(out, 1)
        os.dup2(out, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # The gate: the gateway moves this process into the kernel's
        # cgroup and sets its rlimits, then says go. EOF means it gave up.
        try:
            go, _ = recv_frame(conn)
        except (OSError, EOFError):
            os._exit(125)
        if not go.get("go"):
            os._exit(125)
        if not spare:
            zygote.copy_written_pages()  # now in the kernel's cgroup
        try:
            self.become(req)
        except BaseException as e:
            try:
                send_frame(conn, {"error": "%s: %s" % (type(e).__name__, e)})
            finally:
                os._exit(127)
        send_frame(conn, {"ok": True})
        conn.close()

    @classmethod
    def rehearse(cls, scratch):
        """Starts an ipykernel as a forked kernel starts, up to its event
        loop, and runs a cell: in a copy of the zygote's HOME (a fresh one,
        with the home seed) below scratch, with ZeroMQ sockets on unix
        socket files there, in a child the zygote kills afterwards. Returns
        the (pattern, flags) of the regular expressions it compiled."""
        import re
        import shutil

        cached = set(re._cache)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        env = dict(os.environ)
        for name, sub in (("HOME", "home"), ("TMPDIR", "tmp")):
            old = env.get(name)
            if not old:
                raise RuntimeError("no " + name)
            new = os.path.join(scratch, sub)
            if name == "HOME":
                shutil.copytree(old, new, symlinks=True)
            else:
                os.mkdir(new, 0o700)
            for k, v in env.items():
                if v == old or v.startswith(old + os.sep):
                    env[k] = new + v[len(old):]
        key = os.urandom(16).hex()
        info = {"transport": "ipc", "ip": "k", "key": key, "signature_scheme": "hmac-sha256", "kernel_name": ""}
        for i, name in enumerate(("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")):
            info[name] = i + 1
        with open(os.path.join(scratch, "kernel.json"), "w") as f:
            json.dump(info, f)
        child = cls.__new__(cls)
        child.become({"env": env, "cwd": scratch})
        from ipykernel.kernelapp import IPKernelApp

        app = IPKernelApp.instance()
        app.initialize(["-f", os.path.join(scratch, "kernel.json")])
        # and what a first cell runs through
        app.shell.run_cell("1+1", store_history=True)
        return [[k[1], k[2]] for k in list(re._cache) if k not in cached and len(k) == 3 and isinstance(k[1], str) and isinstance(k[2], int)]

    def become(self, req):
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        import time
        time.tzset()
        # `python -m` puts the working directory first on sys.path.
        if sys.path and sys.path[0] == "":  # the zygote's, from -c
            sys.path[0] = os.getcwd()
        else:
            sys.path.insert(0, os.getcwd())
        self.forget_cached_paths()
        self.reread_class_defaults()
        self.reseed()

    def reread_class_defaults(self):
        # Trait defaults ipykernel reads from the environment when its
        # classes are defined, i.e. in the zygote.
        kapp = sys.modules.get("ipykernel.kernelapp")
        if kapp is not None:
            traits = kapp.IPKernelApp.class_traits()
            for name, var in (("parent_handle", "JPY_PARENT_PID"), ("interrupt", "JPY_INTERRUPT_EVENT")):
                if name in traits:
                    traits[name].default_value = int(os.environ.get(var) or 0)

    def forget_cached_paths(self):
        # Caches that captured the zygote's HOME, TMPDIR or configuration
        # directories at import time.
        import tempfile
        tempfile.tempdir = None
        import sysconfig
        if hasattr(sysconfig, "_CONFIG_VARS"):
            sysconfig._CONFIG_VARS = None
        import site
        old = site.USER_SITE
        site.USER_BASE = None
        site.USER_SITE = None
        new = site.getusersitepackages()
        if old in sys.path:
            sys.path.remove(old)
        if site.ENABLE_USER_SITE and os.path.isdir(new):
            site.addsitedir(new)
        mpl = sys.modules.get("matplotlib")
        if mpl is not None:
            # get_configdir and get_cachedir memoize their first answer.
            for name in ("get_configdir", "get_cachedir"):
                f = getattr(mpl, name, None)
                raw = getattr(f, "__wrapped__", None)
                if raw is not None:
                    setattr(mpl, name, mpl._logged_cached("%s=%%s" % name[4:], raw))

    def reseed(self):
        # random's own at-fork hook reseeded it already; numpy's global
        # RandomState has none. os.urandom, secrets, uuid and tempfile read
        # the kernel's entropy or check the pid themselves. The string hash
        # secret is fixed at interpreter start: see zygote.go.
        import random
        random.seed()
        nr = sys.modules.get("numpy.random")
        if nr is not None:
            nr.seed()


def set_cmdline(argv):
    """Shows argv as the process's command line (ps, /proc/PID/cmdline):
    a forked kernel reads as the kernel it is, not as its zygote. The
    zygote's own command line, which holds this source, is longer than
    any kernel's; a longer one is cut."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
    size = end - start
    new = b"\0".join(a.encode() for a in argv)[: size - 1]
    ctypes.memmove(start, new + b"\0" * (size - len(new)), size)


def send_frame(conn, obj, fds=()):
    b = json.dumps(obj).encode()
    data = struct.pack(">I", len(b)) + b
    if fds:
        conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))])
    else:
        conn.sendall(data)


def recv_frame(conn, want_fds=0):
    fds = []
    head = b""
    while len(head) < 4:
        if want_fds and not fds:
            chunk, more, _, _ = socket.recv_fds(conn, 4 - len(head), want_fds)
            fds.extend(more)
        else:
            chunk = conn.recv(4 - len(head))
        if not chunk:
            raise EOFError("connection closed")
        head += chunk
    (n,) = struct.unpack(">I", head)
    if n > 64 << 20:
        raise ValueError("frame too large")
    body = bytearray()
    while len(body) < n:
        chunk = conn.recv(min(n - len(body), 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        body += chunk
    return json.loads(body), fds


def _main():
    config = json.loads(sys.argv[2])
    ready = 3
    # Descriptors the gateway itself inherited without close-on-exec reach
    # the zygote; none of them is a kernel's business.
    os.closerange(ready + 1, os.sysconf("SC_OPEN_MAX"))
    z = _Zygote(config)
    try:
        z.start(config.get("preload") or [], config["socket"])
    except BaseException as e:
        os.write(ready, ("error %s: %s\n" % (type(e).__name__, e)).encode())
        raise SystemExit(1)
    os.write(ready, b"ready\n")
    os.close(ready)
    return z.serve()


_child = _main()
# From here on this is a kernel: the zygote's frames are gone.
_module, sys.argv = _child.module, ["-m"] + _child.argv[3:]
del _child, _main, _Zygote, Child, send_frame, recv_frame
sys.modules["__main__"] = type(sys)("__main__")
runpy._run_module_as_main(_module)
