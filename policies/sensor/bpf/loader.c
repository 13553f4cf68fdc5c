// SPDX-License-Identifier: GPL-2.0
/* corral-sensor-bpf: loads sensor.bpf.c (embedded as a skeleton), attaches the
 * programs of the syscalls it is told to trace, and copies the ring buffer's
 * records (record.h) to stdout in large writes. Run by policies/sensor/sensor.py:
 *
 *   corral-sensor-bpf --parent-id ID --subsys IDX [--no-exe-details]
 *                     --trace NAME=FLAGS:KIND.POS.LENPOS.SIZE/... ...
 *                     [--raw-exit NR:NAME ...]
 *
 * --raw-exit: syscall number NR (of this ABI) is written by the raw sys_exit
 * program instead of NAME's enter/exit pair, which is then not attached (one
 * record per call): it also sees calls seccomp denies. NAME needs a --trace
 * (its argument layout).
 *
 * stdin takes lines `tick N`: after the next full drain of the ring buffer
 * the loader writes a REC_TICK record carrying N, so every record the kernel
 * wrote before the line reached the loader precedes it on stdout.
 *
 * Exits 0 on SIGTERM/SIGINT or when stdin reaches EOF (its parent is gone);
 * on failure prints one line saying why and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/types.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "record.h"
#include "sensor.skel.h"

#define OUT_CAP (1 << 20)
#define TICK_MS 10
#define MAX_TRACE 64
#define MAX_RAW 16

static volatile sig_atomic_t stopping;
static unsigned char out[OUT_CAP];
static size_t out_len;
static int out_broken;

static const char *const names[] = {
	"",
#define SC(name) #name,
#include "syscalls.h"
#undef SC
};
#define N_NAMES (sizeof(names) / sizeof(names[0]))

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("corral-sensor-bpf: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* libbpf's warnings, one line each; a verifier log is cut to its last line
 * (the reason) unless CORRAL_SENSOR_BPF_VERBOSE is set. */
static int print_libbpf(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	char *msg = NULL;
	if (level != LIBBPF_WARN)
		return 0;
	if (vasprintf(&msg, fmt, ap) < 0)
		return 0;
	char *begin = strstr(msg, "-- BEGIN PROG LOAD LOG --");
	char *end = begin ? strstr(begin, "-- END PROG LOAD LOG --") : NULL;
	if (begin && end && !getenv("CORRAL_SENSOR_BPF_VERBOSE")) {
		char *last = NULL, *line = begin;
		/* the last line that is not the "processed N insns" summary */
		while ((line = strchr(line, '\n')) && line < end) {
			line++;
			if (line < end && strncmp(line, "processed ", 10) && *line != '\n' &&
			    strncmp(line, "-- END", 6))
				last = line;
		}
		int n = last ? (int)(strchr(last, '\n') - last) : 0;
		fprintf(stderr, "libbpf: %.*s verifier: %.*s\n", (int)(begin - msg), msg, n,
			last ? last : "");
	} else {
		for (char *p = msg; *p; p++)
			if (*p == '\n' && p[1])
				*p = ' ';
		fputs(msg, stderr);
	}
	free(msg);
	return 0;
}

static void flush_out(void)
{
	size_t done = 0;
	while (done < out_len && !out_broken) {
		ssize_t n = write(STDOUT_FILENO, out + done, out_len - done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			out_broken = 1; /* the reader is gone */
			stopping = 1;
			break;
		}
		done += (size_t)n;
	}
	out_len = 0;
}

static void put(const void *data, size_t size)
{
	if (out_len + size > OUT_CAP)
		flush_out();
	if (size > OUT_CAP)
		return;
	memcpy(out + out_len, data, size);
	out_len += size;
}

static int on_sample(void *ctx, void *data, size_t size)
{
	(void)ctx;
	put(data, size);
	return 0;
}

static void loader_record(struct rec_hdr *h, __u8 code, __u16 size)
{
	struct timespec ts;
	memset(h, 0, sizeof(*h));
	clock_gettime(CLOCK_MONOTONIC, &ts);
	h->size = size;
	h->code = code;
	h->ts = (__u64)ts.tv_sec * 1000000000ull + (__u64)ts.tv_nsec;
}

static __u64 lost_total(int fd)
{
	int ncpu = libbpf_num_possible_cpus();
	__u64 *vals, sum = 0;
	__u32 key = 0;
	if (ncpu <= 0)
		return 0;
	vals = calloc((size_t)ncpu, sizeof(*vals));
	if (!vals)
		return 0;
	if (bpf_map_lookup_elem(fd, &key, vals) == 0)
		for (int i = 0; i < ncpu; i++)
			sum += vals[i];
	free(vals);
	return sum;
}

static unsigned parse_uint(const char *s, const char *what)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);
	if (!*s || *end)
		die("bad %s: %s", what, s);
	return (unsigned)v;
}

/* NAME=FLAGS:K.P.L.S/K.P.L.S... -> code and descriptor */
static unsigned parse_trace(const char *arg, struct sc_desc *d)
{
	char name[64];
	const char *eq = strchr(arg, '=');
	unsigned code = 0;
	if (!eq || (size_t)(eq - arg) >= sizeof(name))
		die("bad --trace %s", arg);
	memcpy(name, arg, (size_t)(eq - arg));
	name[eq - arg] = 0;
	for (unsigned i = 1; i < N_NAMES; i++)
		if (!strcmp(names[i], name))
			code = i;
	if (!code)
		die("unknown syscall %s", name);
	memset(d, 0, sizeof(*d));
	const char *p = eq + 1;
	char *end;
	d->flags = (__u8)strtoul(p, &end, 10);
	if (*end != ':')
		die("bad --trace %s", arg);
	p = end + 1;
	while (*p && d->nslots < N_SLOTS) {
		unsigned v[4];
		for (int k = 0; k < 4; k++) {
			v[k] = (unsigned)strtoul(p, &end, 10);
			if (end == p)
				die("bad --trace %s", arg);
			p = end + (*end == '.' || *end == '/');
		}
		d->kind[d->nslots] = (__u8)v[0];
		d->pos[d->nslots] = (__u8)v[1];
		d->lenpos[d->nslots] = (__u8)v[2];
		d->size[d->nslots] = (__u8)v[3];
		d->nslots++;
	}
	return code;
}

/* NR:NAME -> NR, and NAME's code */
static unsigned parse_raw(const char *arg, unsigned *code)
{
	const char *colon = strchr(arg, ':');
	char nr[16];
	if (!colon || colon == arg || (size_t)(colon - arg) >= sizeof(nr))
		die("bad --raw-exit %s", arg);
	memcpy(nr, arg, (size_t)(colon - arg));
	nr[colon - arg] = 0;
	unsigned n = parse_uint(nr, "--raw-exit number");
	if (n >= RAW_NR_MAX)
		die("bad --raw-exit %s: number above %d", arg, RAW_NR_MAX - 1);
	*code = 0;
	for (unsigned i = 1; i < N_NAMES; i++)
		if (!strcmp(names[i], colon + 1))
			*code = i;
	if (!*code)
		die("unknown syscall %s", colon + 1);
	return n;
}

/* `tick N` lines from stdin, possibly split across reads; the last N seen
 * goes to *tick (ticks only grow). 0 when stdin is closed or broken. */
static int read_ticks(__u64 *tick, int *have_tick)
{
	static char line[64];
	static size_t len;
	char buf[256];
	ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
	if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
		return 0;
	for (ssize_t i = 0; i < n; i++) {
		if (buf[i] != '\n') {
			if (len < sizeof(line) - 1)
				line[len++] = buf[i];
			continue;
		}
		line[len] = 0;
		if (!strncmp(line, "tick ", 5)) {
			*tick = strtoull(line + 5, NULL, 10);
			*have_tick = 1;
		}
		len = 0;
	}
	return 1;
}

static void attach(struct bpf_program *prog, struct bpf_link **links, int *nlinks)
{
	struct bpf_link *link = bpf_program__attach(prog);
	if (!link)
		die("cannot attach %s: %s", bpf_program__name(prog), strerror(errno));
	links[(*nlinks)++] = link;
}

int main(int argc, char **argv)
{
	unsigned long long parent_id = 0;
	unsigned subsys = 0, ntrace = 0, codes[MAX_TRACE];
	unsigned nraw = 0, raw_nr[MAX_RAW], raw_code[MAX_RAW];
	int exe_details = 1, have_parent = 0;
	struct sc_desc descs[MAX_TRACE];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--parent-id") && i + 1 < argc) {
			parent_id = strtoull(argv[++i], NULL, 10);
			have_parent = 1;
		} else if (!strcmp(argv[i], "--subsys") && i + 1 < argc) {
			subsys = parse_uint(argv[++i], "--subsys");
		} else if (!strcmp(argv[i], "--no-exe-details")) {
			exe_details = 0;
		} else if (!strcmp(argv[i], "--trace") && i + 1 < argc && ntrace < MAX_TRACE) {
			codes[ntrace] = parse_trace(argv[++i], &descs[ntrace]);
			ntrace++;
		} else if (!strcmp(argv[i], "--raw-exit") && i + 1 < argc && nraw < MAX_RAW) {
			raw_nr[nraw] = parse_raw(argv[++i], &raw_code[nraw]);
			nraw++;
		} else {
			die("usage: corral-sensor-bpf --parent-id ID --subsys IDX "
			    "[--no-exe-details] --trace NAME=SPEC... [--raw-exit NR:NAME...]");
		}
	}
	if (!have_parent)
		die("--parent-id is required");
	for (unsigned r = 0; r < nraw; r++) {
		int traced = 0;
		for (unsigned t = 0; t < ntrace; t++)
			traced |= codes[t] == raw_code[r];
		if (!traced)
			die("--raw-exit %u:%s has no --trace", raw_nr[r], names[raw_code[r]]);
	}
#if !defined(__x86_64__)
	if (nraw)
		die("--raw-exit is x86_64 only");
#endif
	if (geteuid() != 0)
		die("not root (loading BPF programs needs CAP_BPF and CAP_PERFMON)");
	if (access("/sys/kernel/btf/vmlinux", R_OK) != 0)
		die("no kernel BTF at /sys/kernel/btf/vmlinux (CO-RE needs CONFIG_DEBUG_INFO_BTF)");

	libbpf_set_print(print_libbpf);
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	struct sensor_bpf *skel = sensor_bpf__open();
	if (!skel)
		die("cannot open the BPF object: %s", strerror(errno));
	skel->rodata->corral_parent_id = parent_id;
	skel->rodata->subsys_idx = subsys;
	skel->rodata->exe_details = (__u32)exe_details;

	struct bpf_program *prog;
	bpf_object__for_each_program(prog, skel->obj)
	{
		const char *n = bpf_program__name(prog);
		int keep = !strcmp(n, "on_fork") || !strcmp(n, "on_task_exit") ||
			   (nraw && !strcmp(n, "on_raw_exit"));
		for (unsigned t = 0; t < ntrace && !keep; t++) {
			const char *sc = names[codes[t]];
			int raw = 0;
			for (unsigned r = 0; r < nraw; r++)
				raw |= raw_code[r] == codes[t];
			keep = !raw && ((!strncmp(n, "enter_", 6) && !strcmp(n + 6, sc)) ||
					(!strncmp(n, "exit_", 5) && !strcmp(n + 5, sc)));
		}
		bpf_program__set_autoload(prog, keep);
	}
	int err = sensor_bpf__load(skel);
	if (err)
		die("cannot load the BPF programs: %s", strerror(-err));
	for (unsigned t = 0; t < ntrace; t++) {
		__u32 key = codes[t];
		if (bpf_map__update_elem(skel->maps.descs, &key, sizeof(key), &descs[t],
					 sizeof(descs[t]), BPF_ANY))
			die("cannot fill the descriptor map: %s", strerror(errno));
	}
	for (unsigned r = 0; r < nraw; r++) {
		__u32 key = raw_nr[r], code = raw_code[r];
		if (bpf_map__update_elem(skel->maps.raw_nrs, &key, sizeof(key), &code, sizeof(code),
					 BPF_ANY))
			die("cannot fill the raw exit map: %s", strerror(errno));
	}

	struct bpf_link *links[2 * MAX_TRACE + 3];
	int nlinks = 0;
	attach(skel->progs.on_fork, links, &nlinks);
	attach(skel->progs.on_task_exit, links, &nlinks);
	bpf_object__for_each_program(prog, skel->obj)
	{
		if (bpf_program__autoload(prog) && prog != skel->progs.on_fork &&
		    prog != skel->progs.on_task_exit)
			attach(prog, links, &nlinks);
	}

	struct ring_buffer *rb =
		ring_buffer__new(bpf_map__fd(skel->maps.events), on_sample, NULL, NULL);
	if (!rb)
		die("cannot open the ring buffer: %s", strerror(errno));

	struct rec_hdr ready;
	loader_record(&ready, REC_ATTACHED, sizeof(ready));
	put(&ready, sizeof(ready));
	flush_out();

	int lost_fd = bpf_map__fd(skel->maps.lost);
	__u64 lost_seen = 0, tick = 0;
	unsigned rounds = 0;
	while (!stopping) {
		struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
		int have_tick = 0;
		int r = poll(&pfd, 1, TICK_MS);
		if (r > 0 && !read_ticks(&tick, &have_tick))
			break; /* the parent closed our stdin: it is gone */
		ring_buffer__consume(rb);
		/* Losses are counted before a tick's answer: a reader that compares
		 * its lost count around a tick sees those of the records before it. */
		if (++rounds % 100 == 0 || have_tick) {
			__u64 total = lost_total(lost_fd);
			if (total != lost_seen) {
				struct rec_lost l;
				loader_record(&l.h, REC_LOST, sizeof(l));
				l.lost = total - lost_seen;
				lost_seen = total;
				put(&l, sizeof(l));
			}
		}
		if (have_tick) {
			struct rec_tick t;
			loader_record(&t.h, REC_TICK, sizeof(t));
			t.n = tick;
			put(&t, sizeof(t));
		}
		flush_out();
	}
	ring_buffer__consume(rb);
	flush_out();
	ring_buffer__free(rb);
	for (int i = 0; i < nlinks; i++)
		bpf_link__destroy(links[i]);
	sensor_bpf__destroy(skel);
	return 0;
}
