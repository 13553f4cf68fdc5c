package main

// A job is one started command: a foreground call (run), a background job
// (spawn) or a session call. Its output either streams to the host as it
// comes (run) or goes to a bounded buffer read by offset (spawn).

import (
	"errors"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	chunkSize     = 64 * 1024
	drainGrace    = 200 * time.Millisecond
	defaultBuffer = 4 << 20
)

type spec struct {
	argv    []string
	env     []string
	dir     string
	pty     bool
	rows    int
	cols    int
	stdin   bool // a pipe (or the pty) the host writes to; else /dev/null
	extra   []*os.File
	timeout time.Duration
}

// ring keeps the last cap bytes of a stream and its total length.
type ring struct {
	buf   []byte
	cap   int
	total int64
}

func (r *ring) write(p []byte) {
	r.total += int64(len(p))
	r.buf = append(r.buf, p...)
	if over := len(r.buf) - r.cap; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
}

// read returns bytes from offset (clamped to what is still held) and the offset they start at.
func (r *ring) read(offset, max int64) ([]byte, int64) {
	start := r.total - int64(len(r.buf))
	if offset < start {
		offset = start
	}
	if offset > r.total {
		offset = r.total
	}
	b := r.buf[offset-start:]
	if max > 0 && int64(len(b)) > max {
		b = b[:max]
	}
	return append([]byte(nil), b...), offset
}

type job struct {
	id       uint32
	pid      int
	started  time.Time
	done     chan struct{}
	exit     exitInfo
	ended    time.Time
	timedOut bool
	killed   bool

	mu        sync.Mutex
	out       [2]ring // stdout, stderr
	readers   sync.WaitGroup
	sink      func(stream int, p []byte) // nil: output goes to the rings
	stdinW    *os.File
	stdinCond *sync.Cond // nil: no stdin
	stdinBuf  [][]byte
	stdinEOF  bool
}

var streamNames = [2]string{"stdout", "stderr"}

// startJob starts s under r; sink (if not nil) gets output chunks as they come.
func startJob(r *reaper, id uint32, s spec, sink func(int, []byte), buffer int) (*job, error) {
	if len(s.argv) == 0 {
		return nil, errors.New("empty argv")
	}
	path := ""
	for _, kv := range s.env {
		if strings.HasPrefix(kv, "PATH=") {
			path = kv[5:]
		}
	}
	argv0, err := lookPath(s.argv[0], path, s.dir)
	if err != nil {
		return nil, err
	}
	if buffer <= 0 {
		buffer = defaultBuffer
	}
	j := &job{id: id, done: make(chan struct{}), sink: sink}
	j.out[0].cap, j.out[1].cap = buffer, buffer
	var childFiles, parentEnds, closeAfter []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	sys := &syscall.SysProcAttr{Setsid: true}
	if s.pty {
		master, slave, err := openPTY(s.rows, s.cols)
		if err != nil {
			return nil, err
		}
		closeAfter = append(closeAfter, slave)
		childFiles = []*os.File{slave, slave, slave}
		sys.Setctty, sys.Ctty = true, 0
		parentEnds = []*os.File{master}
		j.stdinW = master
	} else {
		var stdin *os.File
		if s.stdin {
			rd, wr, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			stdin, j.stdinW = rd, wr
		} else {
			stdin, err = os.Open(os.DevNull)
			if err != nil {
				return nil, err
			}
		}
		closeAfter = append(closeAfter, stdin)
		childFiles = []*os.File{stdin}
		for range streamNames {
			rd, wr, err := os.Pipe()
			if err != nil {
				for _, f := range parentEnds {
					f.Close()
				}
				return nil, err
			}
			childFiles = append(childFiles, wr)
			closeAfter = append(closeAfter, wr)
			parentEnds = append(parentEnds, rd)
		}
	}
	childFiles = append(childFiles, s.extra...)
	fds := make([]uintptr, len(childFiles))
	for i, f := range childFiles {
		fds[i] = f.Fd()
	}
	j.started = time.Now()
	pid, exited, err := r.start(argv0, s.argv, &syscall.ProcAttr{Dir: s.dir, Env: s.env, Files: fds, Sys: sys})
	if err != nil {
		for _, f := range parentEnds {
			f.Close()
		}
		if j.stdinW != nil && !s.pty {
			j.stdinW.Close()
		}
		return nil, err
	}
	j.pid = pid
	for i, f := range parentEnds {
		j.readers.Add(1)
		go j.copyOut(i, f)
	}
	if j.stdinW != nil {
		j.stdinCond = sync.NewCond(&j.mu)
		go j.feedStdin(s.pty)
	}
	var timer *time.Timer
	if s.timeout > 0 {
		timer = time.AfterFunc(s.timeout, func() {
			j.mu.Lock()
			j.timedOut = true
			j.mu.Unlock()
			killTree(pid, syscall.SIGKILL)
		})
	}
	go func() {
		info := <-exited
		if timer != nil {
			timer.Stop()
		}
		j.mu.Lock()
		j.exit, j.ended = info, time.Now()
		if j.stdinCond != nil { // nobody reads stdin any more: end the feeder
			j.stdinEOF = true
			j.stdinCond.Broadcast()
		}
		j.mu.Unlock()
		close(j.done)
	}()
	return j, nil
}

func (j *job) copyOut(stream int, f *os.File) {
	defer j.readers.Done()
	defer f.Close()
	buf := make([]byte, chunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			j.mu.Lock()
			sink := j.sink
			if sink == nil {
				j.out[stream].write(chunk)
			}
			j.mu.Unlock()
			if sink != nil {
				sink(stream, chunk)
			}
		}
		if err != nil { // EOF, or EIO from a pty master once the slave side is gone
			return
		}
	}
}

func (j *job) feedStdin(pty bool) {
	for {
		j.mu.Lock()
		for len(j.stdinBuf) == 0 && !j.stdinEOF {
			j.stdinCond.Wait()
		}
		chunks := j.stdinBuf
		j.stdinBuf = nil
		eof := j.stdinEOF
		j.mu.Unlock()
		for _, chunk := range chunks {
			if _, err := j.stdinW.Write(chunk); err != nil {
				eof = true
				break
			}
		}
		if eof {
			break
		}
	}
	j.mu.Lock()
	j.stdinEOF, j.stdinBuf = true, nil
	j.mu.Unlock()
	if !pty { // a pty's master is also its output: closed by copyOut
		j.stdinW.Close()
	}
}

// writeStdin queues data (eof: then close stdin); never blocks the channel's reader.
func (j *job) writeStdin(data []byte, eof bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stdinCond == nil || j.stdinEOF {
		return
	}
	if len(data) > 0 {
		j.stdinBuf = append(j.stdinBuf, data)
	}
	j.stdinEOF = eof
	j.stdinCond.Signal()
}

// waitOutput waits for the output's end after the process exited; a
// background process still holding the pipes is left writing to a reader
// that now discards (its writes never fail).
func (j *job) waitOutput(grace time.Duration) {
	ch := make(chan struct{})
	go func() { j.readers.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(grace):
	}
	j.mu.Lock()
	if j.sink != nil {
		j.sink = func(int, []byte) {}
	}
	j.mu.Unlock()
}

func (j *job) kill(sig syscall.Signal) {
	j.mu.Lock()
	j.killed = j.killed || sig == syscall.SIGKILL
	j.mu.Unlock()
	killTree(j.pid, sig)
}

// result is the call's end as the host sees it.
func (j *job) result() map[string]any {
	j.mu.Lock()
	defer j.mu.Unlock()
	select {
	case <-j.done:
	default:
		return map[string]any{"op": "exit", "running": true, "pid": j.pid}
	}
	code, sig := exitCode(j.exit.status)
	return map[string]any{
		"op":         "exit",
		"running":    false,
		"pid":        j.pid,
		"exit_code":  code,
		"signal":     sig,
		"timed_out":  j.timedOut,
		"duration_s": j.ended.Sub(j.started).Seconds(),
		"rusage": map[string]any{
			"utime_s":   tvSeconds(j.exit.rusage.Utime),
			"stime_s":   tvSeconds(j.exit.rusage.Stime),
			"maxrss_kb": j.exit.rusage.Maxrss,
		},
	}
}

// session is a shell-like context: its cwd and exported environment carry
// from one call to the next (functions, aliases and shell options do not).
type session struct {
	mu  sync.Mutex
	cwd string
	env []string
}

// sessionScript runs cmd in the session's shell and then hands the shell's
// cwd and exported environment to "agent --session-dump", which writes them to
// fd 3. The user's command never sees fd 3.
func sessionScript(self, cmd string) string {
	return "{\n" + cmd + "\n} 3>&-\nexec " + shellQuote(self) + " --session-dump \"$?\"\n"
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// sessionDump is the --session-dump mode: write cwd and environ to fd 3, exit rc.
func sessionDump(rc int) {
	f := os.NewFile(3, "dump")
	if cwd, err := os.Getwd(); err == nil && f != nil {
		var b strings.Builder
		b.WriteString(cwd)
		b.WriteByte(0)
		for _, kv := range os.Environ() {
			b.WriteString(kv)
			b.WriteByte(0)
		}
		_, _ = io.WriteString(f, b.String())
	}
	os.Exit(rc)
}

// parseDump is the inverse: (cwd, env), ok false for an empty dump (the shell exited early).
func parseDump(b []byte) (string, []string, bool) {
	parts := strings.Split(string(b), "\x00")
	if len(parts) < 2 || parts[0] == "" {
		return "", nil, false
	}
	env := make([]string, 0, len(parts)-1)
	for _, kv := range parts[1:] {
		if kv == "" || strings.HasPrefix(kv, "_=") || strings.HasPrefix(kv, "SHLVL=") {
			continue
		}
		env = append(env, kv)
	}
	return parts[0], env, true
}

// mergeEnv overlays extra (KEY=VALUE map) on base; sorted for stable output.
func mergeEnv(base []string, extra map[string]string) []string {
	m := map[string]string{}
	order := []string{}
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := m[k]; !ok {
			order = append(order, k)
		}
		m[k] = v
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			order = append(order, k)
		}
		m[k] = extra[k]
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+m[k])
	}
	return out
}
