// corral-agent: the exec agent that runs as PID 1 of a Corral sandbox.
//
// Usage: corral-agent -- COMMAND [ARG...]
//
// It starts COMMAND (the sandbox's own command) as a child, reaps every
// orphan, forwards termination signals to COMMAND and exits with its status,
// like tini or catatonit. Besides, it serves the host over its stdin and
// stdout (the task's stdio, FIFOs only the host can reach): see docs/agent.md.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

const prSetDumpable = 4
const prSetChildSubreaper = 36

func main() {
	if len(os.Args) == 3 && os.Args[1] == "--session-dump" {
		rc, _ := strconv.Atoi(os.Args[2])
		sessionDump(rc)
	}
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println("corral-agent", protocolVersion)
		return
	}
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	// Not dumpable: the sandbox's processes (same uid) can neither ptrace the
	// agent nor open its /proc files (its fds: the channel).
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0)
	// Orphans come to the agent when it is not PID 1 too (tests, a nested run).
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	// A write to a closed stdout must not kill the agent (Go's default for fd 1).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	r := newReaper()
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	srv := newServer(os.Stdout, r, self)
	go func() {
		if err := srv.serve(os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, "corral-agent: channel:", err)
		}
		// The host is gone: keep reaping and running COMMAND; calls go through runc exec.
	}()
	if len(args) == 0 {
		select {}
	}
	os.Exit(runMain(r, args))
}

// runMain starts COMMAND with /dev/null for stdin and the agent's stderr for
// output (the agent's stdout is the channel), forwards signals, returns its status.
func runMain(r *reaper, args []string) int {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-agent:", err)
		return 127
	}
	path, err := lookPath(args[0], os.Getenv("PATH"), "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-agent:", err)
		return 127
	}
	sigs := make(chan os.Signal, 8)
	forwarded := []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}
	signal.Notify(sigs, forwarded...)
	cwd, _ := os.Getwd()
	pid, exited, err := r.start(path, args, &syscall.ProcAttr{
		Dir: cwd, Env: os.Environ(), Files: []uintptr{devnull.Fd(), os.Stderr.Fd(), os.Stderr.Fd()},
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	devnull.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-agent: start", args[0]+":", err)
		return 127
	}
	for {
		select {
		case sig := <-sigs:
			safeKill(pid, sig.(syscall.Signal))
		case info := <-exited:
			code, _ := exitCode(info.status)
			return code
		}
	}
}
