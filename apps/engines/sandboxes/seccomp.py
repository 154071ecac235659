"""The seccomp filter every local sandbox command runs under (bwrap `--seccomp FD`).

A classic BPF program, assembled here (no libseccomp needed), that bubblewrap installs last,
right before it execs the sandbox's shell: bubblewrap itself sets up its namespaces and mounts
unfiltered, everything inside runs filtered, and children inherit the filter. It refuses with
EPERM the kernel interfaces a sandboxed command has no use for and that reach past it or
widen the kernel's attack surface:

- other processes' memory: ptrace (any request), process_vm_readv/writev;
- io_uring (setup, enter, register), the kernel keyrings (keyctl, add_key, request_key), eBPF
  (bpf), perf events (perf_event_open), userfaultfd;
- mounts: mount, umount2, pivot_root and the new mount API (open_tree, open_tree_attr,
  move_mount, fsopen, fsconfig, fsmount, fspick, mount_setattr);
- namespaces: unshare, setns, and clone with any CLONE_NEW* flag. clone3 passes its flags in
  memory a filter cannot read, so it fails with ENOSYS ("not implemented"), on which glibc
  falls back to clone for threads and processes.

A system call of another ABI (i386 via int 0x80, x32 on x86_64) kills the process: the numbers
above are those of the 64-bit ABI only. Supported: x86_64 and aarch64 (little-endian).
"""
from __future__ import annotations

import errno
import functools
import platform
import struct

# AUDIT_ARCH_* (linux/audit.h): EM_* | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name: (x86_64 number, aarch64 number)
DENIED = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "open_tree_attr": (467, 467),
    "unshare": (272, 97),
    "setns": (308, 268),
}
CLONE = (56, 220)
CLONE3 = (435, 435)
X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: all in clone's low
# 32 bits, the only ones the kernel reads of a clone() flags argument.
CLONE_NAMESPACE_FLAGS = 0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # args[0]'s low word on a little-endian machine
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in AUDIT_ARCH


@functools.cache
def program(machine: str | None = None) -> bytes:
    """The filter for this machine as bwrap reads it from --seccomp: struct sock_filter
    instructions, back to back. ValueError on an architecture without a table here."""
    machine = machine or platform.machine()
    if not supported(machine):
        raise ValueError(f"no seccomp filter for {machine} (x86_64 and aarch64 only)")
    column = 0 if machine == "x86_64" else 1
    denied = sorted({numbers[column] for numbers in DENIED.values()})
    tests = [("eperm", nr) for nr in denied] + [("enosys", CLONE3[column]), ("clone", CLONE[column])]
    # Where each instruction lands (BPF jumps only forward): the checks of arch and number, a
    # test per number, then the clone flags test and the returns they jump to.
    first_test = 5 if machine == "x86_64" else 4
    allow = first_test + len(tests)
    clone_flags = allow + 1
    eperm, enosys, kill = allow + 4, allow + 5, allow + 6
    code = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, AUDIT_ARCH[machine]),
        (_RET, 0, 0, _KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if machine == "x86_64":
        code.append((_JGE, kill - 4 - 1, 0, X32_SYSCALL_BIT))
    for i, (target, nr) in enumerate(tests, start=first_test):
        to = {"eperm": eperm, "enosys": enosys, "clone": clone_flags}[target]
        code.append((_JEQ, to - i - 1, 0, nr))
    code += [
        (_RET, 0, 0, _ALLOW),
        (_LD_W_ABS, 0, 0, _ARG0_LOW),
        (_JSET, eperm - (clone_flags + 1) - 1, 0, CLONE_NAMESPACE_FLAGS),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.EPERM),
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
        (_RET, 0, 0, _KILL_PROCESS),
    ]
    assert len(code) == kill + 1
    assert all(0 <= jt <= 255 for _, jt, _, _ in code)
    return b"".join(struct.pack("=HBBI", *insn) for insn in code)
