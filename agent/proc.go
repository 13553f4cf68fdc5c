package main

// Process handling: one reaper for every child (as PID 1 the agent also
// inherits every orphan of the sandbox), process start under the reaper's
// lock (so no exit is reaped before its waiter is registered), whole-tree
// kills and PTYs.

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

type exitInfo struct {
	status syscall.WaitStatus
	rusage syscall.Rusage
}

// reaper owns wait4: nothing else in the agent waits for a child.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exitInfo
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan exitInfo{}}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	go func() {
		for range sig {
			r.reap()
		}
	}()
	return r
}

// reap collects every exited child; those started through start get their status.
func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, &ru)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ws.Stopped() || ws.Continued() {
			continue
		}
		if ch, ok := r.waiters[pid]; ok {
			ch <- exitInfo{status: ws, rusage: ru}
			delete(r.waiters, pid)
		}
	}
}

// start forks and execs; the returned channel receives the child's exit.
func (r *reaper) start(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan exitInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitInfo, 1)
	r.waiters[pid] = ch
	go r.reap() // a child that exited before its SIGCHLD was handled
	return pid, ch, nil
}

// lookPath resolves name the way execvp would, with the call's PATH and cwd.
func lookPath(name, path, dir string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		return p, executable(p)
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s: not an executable file", p)
	}
	return nil
}

// procStat is what tree kills need from /proc/<pid>/stat.
type procStat struct{ pid, ppid, pgrp, sid int }

func readProcs() []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make([]procStat, 0, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp session ...": comm may hold spaces and parens.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 4 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		sid, _ := strconv.Atoi(f[3])
		out = append(out, procStat{pid, ppid, pgrp, sid})
	}
	return out
}

// treeOf is root and everything under it: descendants by parent links, and
// (root leads its own session and group, as every call's process does) the
// members of root's session and process group, orphans reparented to PID 1
// included. A process that made a session of its own is found while its
// parent chain to root is alive.
func treeOf(root int, procs []procStat) map[int]bool {
	tree := map[int]bool{}
	if root <= 1 {
		return tree
	}
	tree[root] = true
	for changed := true; changed; {
		changed = false
		for _, p := range procs {
			if tree[p.pid] {
				continue
			}
			if tree[p.ppid] || p.sid == root || p.pgrp == root {
				tree[p.pid] = true
				changed = true
			}
		}
	}
	return tree
}

// safeKill never signals pid <= 1 (kill(-1) or kill(0) would reach far more
// than the call) nor the agent itself.
func safeKill(pid int, sig syscall.Signal) {
	if pid <= 1 || pid == os.Getpid() {
		return
	}
	_ = syscall.Kill(pid, sig)
}

// killTree stops the whole tree first (a stopped process cannot fork or
// escape), until no new member turns up, then kills every member.
func killTree(root int, sig syscall.Signal) {
	if root <= 1 || root == os.Getpid() {
		return
	}
	seen := map[int]bool{}
	if sig == syscall.SIGKILL {
		for round := 0; round < 20; round++ {
			fresh := 0
			for pid := range treeOf(root, readProcs()) {
				if !seen[pid] {
					seen[pid] = true
					fresh++
					safeKill(pid, syscall.SIGSTOP)
				}
			}
			if fresh == 0 {
				break
			}
		}
	} else {
		seen = treeOf(root, readProcs())
	}
	for pid := range seen {
		safeKill(pid, sig)
	}
	if sig == syscall.SIGKILL {
		// Members that were forked mid-kill, or a group out of /proc's sight.
		for pid := range treeOf(root, readProcs()) {
			safeKill(pid, syscall.SIGKILL)
		}
		safeKill(-root, syscall.SIGKILL) // root's process group (root > 1 checked above)
	}
}

// openPTY returns the master and the slave of a new pseudo-terminal.
func openPTY(rows, cols int) (*os.File, *os.File, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var unlock int32
	if err := ioctl(master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlockpt: %w", err)
	}
	var n uint32
	if err := ioctl(master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("ptsname: %w", err)
	}
	slave, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	if rows > 0 && cols > 0 {
		ws := struct{ row, col, x, y uint16 }{uint16(rows), uint16(cols), 0, 0}
		_ = ioctl(master.Fd(), syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws)))
	}
	return master, slave, nil
}

func ioctl(fd, req, arg uintptr) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg); errno != 0 {
		return errno
	}
	return nil
}

// exitCode is the shell's convention: the status, or 128 + the killing signal.
func exitCode(ws syscall.WaitStatus) (int, int) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), int(ws.Signal())
	}
	return ws.ExitStatus(), 0
}

func tvSeconds(tv syscall.Timeval) float64 {
	return float64(tv.Sec) + float64(tv.Usec)/1e6
}

var _ = time.Second
