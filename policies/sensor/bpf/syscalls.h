/* The syscalls the BPF object can trace, in program.py's CODES order
 * (sorted names; the first is code 1). tests/unit/sensor checks the order. */
SC(accept) SC(accept4) SC(bind) SC(bpf) SC(chdir) SC(chmod) SC(chroot) SC(close)
SC(connect) SC(creat) SC(dup) SC(dup2) SC(dup3) SC(execve) SC(execveat) SC(fchdir)
SC(fchmod) SC(fchmodat) SC(finit_module) SC(init_module) SC(kill) SC(link) SC(linkat)
SC(listen) SC(memfd_create) SC(mkdir) SC(mkdirat) SC(mount) SC(open) SC(openat)
SC(openat2) SC(prctl) SC(ptrace) SC(rename) SC(renameat) SC(renameat2) SC(rmdir)
SC(sendmsg) SC(sendto) SC(setgid) SC(setns) SC(setuid) SC(socket) SC(socketpair)
SC(symlink) SC(symlinkat) SC(umount) SC(umount2) SC(unlink) SC(unlinkat) SC(unshare)
SC(userfaultfd)
