package main

// The request loop: frames in on stdin, replies out on stdout. Every request
// that can take time runs in a goroutine of its own; the loop never blocks on
// a process.

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

const protocolVersion = 1

type request struct {
	Op        string            `json:"op"`
	Argv      []string          `json:"argv,omitempty"`
	Shell     string            `json:"shell,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	TimeoutS  float64           `json:"timeout_s,omitempty"`
	MaxOutput int64             `json:"max_output,omitempty"`
	Session   string            `json:"session,omitempty"`
	PTY       bool              `json:"pty,omitempty"`
	Rows      int               `json:"rows,omitempty"`
	Cols      int               `json:"cols,omitempty"`
	StdinOpen bool              `json:"stdin_open,omitempty"`
	Job       uint32            `json:"job,omitempty"`
	Stream    string            `json:"stream,omitempty"`
	Offset    int64             `json:"offset,omitempty"`
	Max       int64             `json:"max,omitempty"`
	Signal    int               `json:"signal,omitempty"`
	EOF       bool              `json:"eof,omitempty"`
	Path      string            `json:"path,omitempty"`
	Mode      uint32            `json:"mode,omitempty"`
	Sha256    string            `json:"sha256,omitempty"`
	Buffer    int               `json:"buffer,omitempty"`
}

type upload struct {
	tmp  *os.File
	path string
	mode os.FileMode
	hash hashWriter
	size int64
	err  error
}

type hashWriter interface {
	io.Writer
	Sum([]byte) []byte
}

type server struct {
	out      *sender
	reaper   *reaper
	self     string // the agent's own path inside the sandbox (for --session-dump)
	baseEnv  []string
	baseDir  string
	mu       sync.Mutex
	jobs     map[uint32]*job // every call's process, by the call's id
	sessions map[string]*session
	uploads  map[uint32]*upload
	early    map[uint32][]stdinChunk // calls still starting: stdin frames that came first
}

type stdinChunk struct {
	data []byte
	eof  bool
}

func newServer(w io.Writer, r *reaper, self string) *server {
	dir, err := os.Getwd()
	if err != nil {
		dir = "/"
	}
	return &server{
		out: &sender{w: w}, reaper: r, self: self, baseEnv: os.Environ(), baseDir: dir,
		jobs: map[uint32]*job{}, sessions: map[string]*session{}, uploads: map[uint32]*upload{},
		early: map[uint32][]stdinChunk{},
	}
}

// serve reads requests until the host side closes. Bytes that are not a whole
// frame (the rest of one a dying host left half-written) are skipped up to the
// next valid header, so a host that attaches later is heard (docs/agent.md).
func (s *server) serve(in io.Reader) error {
	br := bufio.NewReaderSize(in, 1<<16)
	for {
		if skipped, err := skipToHeader(br); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		} else if skipped > 0 {
			fmt.Fprintf(os.Stderr, "corral-agent: skipped %d bytes to the next frame\n", skipped)
		}
		f, err := readFrame(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		var req request
		if err := json.Unmarshal(f.meta, &req); err != nil {
			s.fail(f.id, "bad_request", "meta: "+err.Error())
			continue
		}
		s.handle(f.id, req, f.data)
	}
}

func (s *server) reply(id uint32, meta map[string]any, data []byte) {
	_ = s.out.send(id, meta, data)
}

func (s *server) fail(id uint32, kind, msg string) {
	s.reply(id, map[string]any{"op": "error", "kind": kind, "error": msg}, nil)
}

func (s *server) handle(id uint32, req request, data []byte) {
	switch req.Op {
	case "hello":
		s.reply(id, map[string]any{"op": "hello", "version": protocolVersion, "pid": os.Getpid()}, nil)
	case "run", "spawn":
		s.mu.Lock()
		s.early[id] = nil // starting: stdin frames for it are kept until it runs
		s.mu.Unlock()
		go s.run(id, req, data)
	case "stdin":
		s.mu.Lock()
		j := s.jobs[req.Job]
		if chunks, starting := s.early[req.Job]; j == nil && starting {
			s.early[req.Job] = append(chunks, stdinChunk{data, req.EOF}) // run registers it
		}
		s.mu.Unlock()
		if j != nil {
			j.writeStdin(data, req.EOF)
		}
	case "output":
		s.output(id, req)
	case "wait":
		go s.wait(id, req)
	case "kill":
		j := s.job(req.Job)
		if j == nil {
			s.fail(id, "not_found", fmt.Sprintf("no job %d", req.Job))
			return
		}
		sig := syscall.SIGKILL
		if req.Signal > 0 {
			sig = syscall.Signal(req.Signal)
		}
		j.kill(sig)
		s.reply(id, map[string]any{"op": "ok"}, nil)
	case "forget":
		s.mu.Lock()
		delete(s.jobs, req.Job)
		s.mu.Unlock()
		s.reply(id, map[string]any{"op": "ok"}, nil)
	case "put_begin":
		s.putBegin(id, req)
	case "put_data":
		s.putData(id, data)
	case "put_end":
		s.putEnd(id, req)
	case "get":
		go s.get(id, req)
	default:
		s.fail(id, "bad_request", "unknown op "+req.Op)
	}
}

func (s *server) job(id uint32) *job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs[id]
}

// run starts a call: "run" streams its output and replies with its end;
// "spawn" replies at once and keeps the job's output for "output" requests.
func (s *server) run(id uint32, req request, stdin []byte) {
	sp := spec{pty: req.PTY, rows: req.Rows, cols: req.Cols}
	sp.stdin = len(stdin) > 0 || req.StdinOpen || req.PTY
	if req.TimeoutS > 0 {
		sp.timeout = time.Duration(req.TimeoutS * float64(time.Second))
	}
	var sess *session
	var dumpR *os.File
	if req.Session != "" {
		sess = s.session(req.Session, req.Cwd)
		sess.mu.Lock() // one call at a time per session
		defer sess.mu.Unlock()
		cmd := req.Shell
		if cmd == "" {
			quoted := make([]string, len(req.Argv))
			for i, a := range req.Argv {
				quoted[i] = shellQuote(a)
			}
			cmd = strings.Join(quoted, " ")
		}
		sp.argv = []string{"/bin/sh", "-c", sessionScript(s.self, cmd)}
		sp.env = mergeEnv(sess.env, req.Env)
		sp.dir = sess.cwd
		r, w, err := os.Pipe()
		if err != nil {
			s.startFailed(id, err)
			return
		}
		dumpR = r
		defer dumpR.Close()
		sp.extra = []*os.File{w}
		defer w.Close()
	} else {
		if req.Shell != "" {
			sp.argv = []string{"/bin/sh", "-c", req.Shell}
		} else {
			sp.argv = req.Argv
		}
		sp.env = mergeEnv(s.baseEnv, req.Env)
		sp.dir = req.Cwd
		if sp.dir == "" {
			sp.dir = s.baseDir
		}
	}
	var sink func(int, []byte)
	if req.Op == "run" {
		limit := req.MaxOutput
		var sent [2]int64
		var mu sync.Mutex
		sink = func(stream int, p []byte) {
			mu.Lock()
			room := limit - sent[stream]
			if limit > 0 && int64(len(p)) > room {
				if room < 0 {
					room = 0
				}
				p = p[:room]
			}
			sent[stream] += int64(len(p))
			mu.Unlock()
			if len(p) > 0 {
				s.reply(id, map[string]any{"op": "out", "stream": streamNames[stream]}, p)
			}
		}
	}
	j, err := startJob(s.reaper, id, sp, sink, req.Buffer)
	if sp.extra != nil {
		sp.extra[0].Close() // the child holds its copy
	}
	if err != nil {
		s.startFailed(id, err)
		return
	}
	s.mu.Lock()
	s.jobs[id] = j
	for _, c := range s.early[id] { // in order, before any later frame (those take s.mu)
		j.writeStdin(c.data, c.eof)
	}
	delete(s.early, id)
	s.mu.Unlock()
	if len(stdin) > 0 || (sp.stdin && !req.StdinOpen && !req.PTY) {
		j.writeStdin(stdin, !req.StdinOpen && !req.PTY)
	}
	if req.Op == "spawn" {
		s.reply(id, map[string]any{"op": "spawned", "job": id, "pid": j.pid}, nil)
		return
	}
	var dump []byte
	if dumpR != nil {
		dump, _ = io.ReadAll(dumpR) // EOF once the shell (or the dump) exits
	}
	<-j.done
	j.waitOutput(drainGrace)
	if sess != nil {
		if cwd, env, ok := parseDump(dump); ok {
			sess.cwd, sess.env = cwd, env
		}
	}
	res := j.result()
	s.mu.Lock()
	delete(s.jobs, id)
	s.mu.Unlock()
	s.reply(id, res, nil)
}

func (s *server) startFailed(id uint32, err error) {
	s.mu.Lock()
	delete(s.early, id)
	s.mu.Unlock()
	s.fail(id, "start_failed", err.Error())
}

func (s *server) session(name, cwd string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessions[name]
	if !ok {
		if cwd == "" {
			cwd = s.baseDir
		}
		sess = &session{cwd: cwd, env: append([]string(nil), s.baseEnv...)}
		s.sessions[name] = sess
	}
	return sess
}

func (s *server) output(id uint32, req request) {
	j := s.job(req.Job)
	if j == nil {
		s.fail(id, "not_found", fmt.Sprintf("no job %d", req.Job))
		return
	}
	stream := 0
	if req.Stream == "stderr" {
		stream = 1
	}
	j.mu.Lock()
	data, offset := j.out[stream].read(req.Offset, req.Max)
	total := j.out[stream].total
	j.mu.Unlock()
	running := true
	select {
	case <-j.done:
		running = false
	default:
	}
	s.reply(id, map[string]any{"op": "output", "offset": offset, "total": total, "running": running}, data)
}

func (s *server) wait(id uint32, req request) {
	j := s.job(req.Job)
	if j == nil {
		s.fail(id, "not_found", fmt.Sprintf("no job %d", req.Job))
		return
	}
	var timeout <-chan time.Time
	if req.TimeoutS > 0 {
		timeout = time.After(time.Duration(req.TimeoutS * float64(time.Second)))
	}
	select {
	case <-j.done:
		j.waitOutput(drainGrace)
	case <-timeout:
	}
	s.reply(id, j.result(), nil)
}

// -- files --------------------------------------------------------------------

func (s *server) putBegin(id uint32, req request) {
	up := &upload{path: req.Path, mode: os.FileMode(req.Mode & 0o7777), hash: sha256.New()}
	if up.mode == 0 {
		up.mode = 0o644
	}
	if !filepath.IsAbs(req.Path) {
		up.err = fmt.Errorf("path %q is not absolute", req.Path)
	} else if err := os.MkdirAll(filepath.Dir(req.Path), 0o755); err != nil {
		up.err = err
	} else {
		up.tmp, up.err = os.CreateTemp(filepath.Dir(req.Path), ".corral-put-*")
	}
	s.mu.Lock()
	s.uploads[id] = up
	s.mu.Unlock()
}

func (s *server) putData(id uint32, data []byte) {
	s.mu.Lock()
	up := s.uploads[id]
	s.mu.Unlock()
	if up == nil || up.err != nil {
		return
	}
	if _, err := up.tmp.Write(data); err != nil {
		up.err = err
		return
	}
	up.hash.Write(data)
	up.size += int64(len(data))
}

func (s *server) putEnd(id uint32, req request) {
	s.mu.Lock()
	up := s.uploads[id]
	delete(s.uploads, id)
	s.mu.Unlock()
	if up == nil {
		s.fail(id, "bad_request", "put_end without put_begin")
		return
	}
	sum := hex.EncodeToString(up.hash.Sum(nil))
	if up.err == nil && req.Sha256 != "" && req.Sha256 != sum {
		up.err = fmt.Errorf("sha256 mismatch: got %s, sent %s", sum, req.Sha256)
	}
	if up.tmp != nil {
		if up.err == nil {
			up.err = up.tmp.Chmod(up.mode)
		}
		if err := up.tmp.Close(); up.err == nil {
			up.err = err
		}
		if up.err == nil {
			up.err = os.Rename(up.tmp.Name(), up.path)
		}
		if up.err != nil {
			os.Remove(up.tmp.Name())
		}
	}
	if up.err != nil {
		s.fail(id, "io", fmt.Sprintf("write %s: %v", up.path, up.err))
		return
	}
	s.reply(id, map[string]any{"op": "ok", "size": up.size, "sha256": sum}, nil)
}

func (s *server) get(id uint32, req request) {
	f, err := os.Open(req.Path)
	if err != nil {
		kind := "io"
		if errors.Is(err, os.ErrNotExist) {
			kind = "not_found"
		}
		s.fail(id, kind, fmt.Sprintf("read %s: %v", req.Path, err))
		return
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && !st.Mode().IsRegular() {
		s.fail(id, "not_found", fmt.Sprintf("read %s: not a regular file", req.Path))
		return
	}
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var size int64
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if req.Max > 0 && size+int64(n) > req.Max {
				s.fail(id, "too_large", fmt.Sprintf("read %s: larger than %d B", req.Path, req.Max))
				return
			}
			h.Write(buf[:n])
			size += int64(n)
			s.reply(id, map[string]any{"op": "data"}, buf[:n])
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			s.fail(id, "io", fmt.Sprintf("read %s: %v", req.Path, err))
			return
		}
	}
	s.reply(id, map[string]any{"op": "ok", "size": size, "sha256": hex.EncodeToString(h.Sum(nil))}, nil)
}
