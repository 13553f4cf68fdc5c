package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var testReaper = newReaper()

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return f[0] != "Z" && f[0] != "X"
}

type collected struct {
	mu  sync.Mutex
	out [2]bytes.Buffer
}

func (c *collected) sink(stream int, p []byte) {
	c.mu.Lock()
	c.out[stream].Write(p)
	c.mu.Unlock()
}

func run(t *testing.T, s spec) (*job, *collected) {
	t.Helper()
	c := &collected{}
	if s.env == nil {
		s.env = os.Environ()
	}
	j, err := startJob(testReaper, 1, s, c.sink, 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-j.done:
	case <-time.After(30 * time.Second):
		t.Fatal("job did not end")
	}
	j.waitOutput(time.Second)
	return j, c
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	s := &sender{w: &buf}
	if err := s.send(7, map[string]any{"op": "out"}, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	f, err := readFrame(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	_ = json.Unmarshal(f.meta, &meta)
	if f.id != 7 || meta["op"] != "out" || string(f.data) != "hello" {
		t.Fatalf("got %d %v %q", f.id, meta, f.data)
	}
	bad := encodeFrame(1, []byte("{}"), nil)
	bad[5] ^= 1
	if _, err := readFrame(bytes.NewReader(bad)); err == nil {
		t.Fatal("a corrupt header was accepted")
	}
	if _, err := readFrame(bytes.NewReader(nil)); err != io.EOF {
		t.Fatalf("empty stream: %v", err)
	}
}

func TestRunExitCodeAndOutput(t *testing.T) {
	j, c := run(t, spec{argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}})
	res := j.result()
	if res["exit_code"] != 3 || c.out[0].String() != "out\n" || c.out[1].String() != "err\n" {
		t.Fatalf("got %v %q %q", res, c.out[0].String(), c.out[1].String())
	}
}

func TestStdin(t *testing.T) {
	c := &collected{}
	j, err := startJob(testReaper, 1, spec{argv: []string{"cat"}, env: os.Environ(), stdin: true}, c.sink, 0)
	if err != nil {
		t.Fatal(err)
	}
	j.writeStdin([]byte("abc"), false)
	j.writeStdin([]byte("def"), true)
	<-j.done
	j.waitOutput(time.Second)
	if c.out[0].String() != "abcdef" {
		t.Fatalf("got %q", c.out[0].String())
	}
}

func TestMissingCommand(t *testing.T) {
	if _, err := startJob(testReaper, 1, spec{argv: []string{"no-such-command-xyz"}, env: os.Environ()}, nil, 0); err == nil {
		t.Fatal("started a missing command")
	}
}

func TestTimeoutKillsSetsidChild(t *testing.T) {
	pidFile := t.TempDir() + "/pid"
	j, _ := run(t, spec{
		argv:    []string{"/bin/sh", "-c", "setsid sh -c 'echo $$ > " + pidFile + "; exec sleep 300' & sleep 300"},
		timeout: 500 * time.Millisecond,
	})
	res := j.result()
	if res["timed_out"] != true || res["exit_code"] != 137 {
		t.Fatalf("got %v", res)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	for i := 0; i < 100 && alive(pid); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		safeKill(pid, syscall.SIGKILL)
		t.Fatalf("the setsid child %d survived the timeout", pid)
	}
}

func TestBackgroundJobKilledWithTree(t *testing.T) {
	pidFile := t.TempDir() + "/pid"
	j, err := startJob(testReaper, 2, spec{
		argv: []string{"/bin/sh", "-c", "sleep 300 & echo $! > " + pidFile + "; echo started; wait"},
		env:  os.Environ(),
	}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for i := 0; i < 200 && pid == 0; i++ {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		time.Sleep(20 * time.Millisecond)
	}
	if pid <= 1 {
		t.Fatal("no grandchild pid")
	}
	j.kill(syscall.SIGKILL)
	<-j.done
	for i := 0; i < 100 && alive(pid); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		t.Fatalf("grandchild %d survived", pid)
	}
	j.waitOutput(time.Second)
	data, _ := j.out[0].read(0, 0)
	if string(data) != "started\n" {
		t.Fatalf("buffered output %q", data)
	}
}

func TestKillNeverSignalsPIDOneOrBelow(t *testing.T) {
	// Would kill everything (kill(-1)) or the test's group (kill(0)) if unguarded.
	killTree(0, syscall.SIGKILL)
	killTree(1, syscall.SIGKILL)
	killTree(-1, syscall.SIGKILL)
	safeKill(-1, syscall.SIGKILL)
	safeKill(0, syscall.SIGKILL)
	safeKill(os.Getpid(), syscall.SIGKILL)
	if len(treeOf(1, readProcs())) != 0 || len(treeOf(0, readProcs())) != 0 {
		t.Fatal("a tree rooted at pid <= 1")
	}
}

func TestPTY(t *testing.T) {
	j, c := run(t, spec{argv: []string{"/bin/sh", "-c", "test -t 0 && test -t 1 && echo tty"}, pty: true, stdin: true, rows: 24, cols: 80})
	if j.result()["exit_code"] != 0 || !strings.Contains(c.out[0].String(), "tty") {
		t.Fatalf("got %v %q", j.result(), c.out[0].String())
	}
}

func TestRing(t *testing.T) {
	r := ring{cap: 4}
	r.write([]byte("abc"))
	r.write([]byte("def"))
	data, off := r.read(0, 0)
	if string(data) != "cdef" || off != 2 || r.total != 6 {
		t.Fatalf("got %q at %d", data, off)
	}
	data, off = r.read(5, 10)
	if string(data) != "f" || off != 5 {
		t.Fatalf("got %q at %d", data, off)
	}
}

func TestSessionDumpParse(t *testing.T) {
	cwd, env, ok := parseDump([]byte("/tmp\x00A=1\x00_=/bin/x\x00B=2\x00"))
	if !ok || cwd != "/tmp" || strings.Join(env, ",") != "A=1,B=2" {
		t.Fatalf("got %q %v %v", cwd, env, ok)
	}
	if _, _, ok := parseDump(nil); ok {
		t.Fatal("an empty dump parsed")
	}
}

// The server end to end over in-memory pipes, with a session (needs the built
// agent for --session-dump: built into a temp dir).
func TestServerSession(t *testing.T) {
	bin := t.TempDir() + "/corral-agent"
	if out, err := runCmd("go", "build", "-o", bin, "."); err != nil {
		t.Skip("cannot build the agent: ", out)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	srv := newServer(outW, testReaper, bin)
	go func() { _ = srv.serve(inR) }()
	client := &sender{w: inW}
	call := func(id uint32, req map[string]any) (map[string]any, string) {
		if err := client.send(id, req, nil); err != nil {
			t.Fatal(err)
		}
		var stdout strings.Builder
		for {
			f, err := readFrame(outR)
			if err != nil {
				t.Fatal(err)
			}
			var meta map[string]any
			_ = json.Unmarshal(f.meta, &meta)
			if meta["op"] == "out" {
				stdout.Write(f.data)
				continue
			}
			return meta, stdout.String()
		}
	}
	dir := t.TempDir()
	call(1, map[string]any{"op": "run", "session": "s", "shell": "cd " + dir + " && export FOO=bar"})
	res, out := call(2, map[string]any{"op": "run", "session": "s", "shell": "pwd; echo $FOO"})
	if res["exit_code"] != float64(0) || out != dir+"\nbar\n" {
		t.Fatalf("got %v %q", res, out)
	}
}

func runCmd(name string, args ...string) (string, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return "", err
	}
	defer devnull.Close()
	cwd, _ := os.Getwd()
	fd := devnull.Fd()
	_, exited, err := testReaper.start(mustLook(name), append([]string{name}, args...),
		&syscall.ProcAttr{Dir: cwd, Env: os.Environ(), Files: []uintptr{fd, fd, fd}})
	if err != nil {
		return "", err
	}
	if code, _ := exitCode((<-exited).status); code != 0 {
		return "exit " + strconv.Itoa(code), os.ErrInvalid
	}
	return "", nil
}

func mustLook(name string) string {
	p, err := lookPath(name, os.Getenv("PATH"), "")
	if err != nil {
		return name
	}
	return p
}

func TestMainCommandStatusIsTheAgentsStatus(t *testing.T) {
	if code := runMain(testReaper, []string{"/bin/sh", "-c", "exit 7"}); code != 7 {
		t.Fatalf("exit %d", code)
	}
	if code := runMain(testReaper, []string{"no-such-command-xyz"}); code != 127 {
		t.Fatalf("missing command: exit %d", code)
	}
}

func TestServeEndsOnEOFAndSkipsToTheNextWholeFrame(t *testing.T) {
	srv := newServer(io.Discard, testReaper, "/nonexistent")
	if err := srv.serve(bytes.NewReader(nil)); err != nil {
		t.Fatalf("EOF: %v", err)
	}
	// What a host that died mid-frame leaves (the tail of a frame, or garbage
	// that even holds a false magic), then the next host's hello: answered.
	hello := encodeFrame(9, []byte(`{"op":"hello"}`), nil)
	old := encodeFrame(3, []byte(`{"op":"put"}`), bytes.Repeat([]byte("x"), 70000))
	for _, lead := range [][]byte{old[7:], []byte("GARBAGE-CRA1-GARBAGE"), old[:0]} {
		var out bytes.Buffer
		srv := newServer(&out, testReaper, "/nonexistent")
		stream := append(append([]byte{}, lead...), hello...)
		if err := srv.serve(bytes.NewReader(stream)); err != nil {
			t.Fatalf("lead %d bytes: %v", len(lead), err)
		}
		f, err := readFrame(&out)
		if err != nil || f.id != 9 || !strings.Contains(string(f.meta), "hello") {
			t.Fatalf("lead %d bytes: got %v %s", len(lead), err, f.meta)
		}
	}
}
