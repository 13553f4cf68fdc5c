// SPDX-License-Identifier: GPL-2.0
/* Corral's sensor, compiled: the syscalls the rules need, from sandboxes only,
 * as fixed-layout binary records (record.h) in a ring buffer.
 *
 * The same kernel-side filter as policies/sensor/program.py: a task is in a
 * sandbox when the parent (or grandparent) of its v1 cgroup in the `subsys_idx`
 * controller is /corral (kernfs id `corral_parent_id`). Syscall arguments are
 * saved per thread at enter and the record is written at exit with the return
 * value and the strings inline (one record per syscall); execve's filename and
 * argv are written at enter (the old image is gone at exit). Programs for
 * syscalls no rule needs are not loaded at all (the loader's choice). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "record.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u64 corral_parent_id = 0;
const volatile __u32 subsys_idx = 0;
const volatile __u32 exe_details = 1;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 << 20);
} events SEC(".maps");

struct corral_saved {
	__u64 cgid;
	__u64 args[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct corral_saved);
} inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct sc_desc);
} descs SEC(".maps");

struct corral_scratch {
	__u8 buf[SCRATCH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct corral_scratch);
} scratch_map SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* kernfs_node.parent became __parent in Linux 6.15: either may exist. */
struct kernfs_node___new {
	struct kernfs_node___new *__parent;
	__u64 id;
} __attribute__((preserve_access_index));

struct kernfs_node___old {
	struct kernfs_node___old *parent;
	__u64 id;
} __attribute__((preserve_access_index));

/* inode times: i_ctime_sec & co. since 6.11, a timespec64 before. */
struct inode___old {
	struct timespec64 __i_ctime;
	struct timespec64 i_mtime;
} __attribute__((preserve_access_index));

static __always_inline void *kn_parent(void *kn)
{
	if (!kn)
		return 0;
	if (bpf_core_field_exists(struct kernfs_node___new, __parent))
		return BPF_CORE_READ((struct kernfs_node___new *)kn, __parent);
	return BPF_CORE_READ((struct kernfs_node___old *)kn, parent);
}

static __always_inline __u64 kn_id(void *kn)
{
	if (!kn)
		return 0;
	return BPF_CORE_READ((struct kernfs_node___new *)kn, id);
}

/* The leaf cgroup's kernfs id if the task is in a sandbox, else 0. */
static __always_inline __u64 sandbox_cgid(struct task_struct *t)
{
	struct css_set *cs = BPF_CORE_READ(t, cgroups);
	struct cgroup_subsys_state *css = 0;
	__u32 idx = subsys_idx;

	if (!cs || idx >= 16)
		return 0;
	bpf_probe_read_kernel(&css, sizeof(css),
			      (void *)cs + bpf_core_field_offset(struct css_set, subsys) +
				      idx * sizeof(void *));
	if (!css)
		return 0;
	void *kn = BPF_CORE_READ(css, cgroup, kn);
	void *parent = kn_parent(kn);
	if (!parent)
		return 0;
	if (kn_id(parent) == corral_parent_id || kn_id(kn_parent(parent)) == corral_parent_id)
		return kn_id(kn);
	return 0;
}

static __always_inline __u8 *scratch_buf(void)
{
	__u32 zero = 0;
	struct corral_scratch *s = bpf_map_lookup_elem(&scratch_map, &zero);
	return s ? s->buf : 0;
}

static __always_inline void count_lost(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&lost, &zero);
	if (n)
		*n += 1;
}

static __always_inline void emit(void *buf, __u32 size)
{
	size &= SCRATCH_MASK;
	if (size < sizeof(struct rec_hdr))
		return;
	((struct rec_hdr *)buf)->size = size;
	/* No wake-up: the loader drains the ring on a short timer, in batches. */
	if (bpf_ringbuf_output(&events, buf, size, BPF_RB_NO_WAKEUP))
		count_lost();
}

static __always_inline void fill_hdr(struct rec_hdr *h, __u8 code, __u16 sc, __u64 cgid)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 ugid = bpf_get_current_uid_gid();

	h->code = code;
	h->flags = 0;
	h->sc = sc;
	h->pad = 0;
	h->tid = (__u32)pid_tgid;
	h->pid = pid_tgid >> 32;
	h->ts = bpf_ktime_get_ns();
	h->cgid = cgid;
	h->uid = (__u32)ugid;
	h->gid = ugid >> 32;
	bpf_get_current_comm(h->comm, sizeof(h->comm));
}

/* ------------------------------------------------------------ exec at enter */

static __always_inline void exec_enter(const struct corral_saved *s, __u16 sc, __u64 cgid,
				       const struct sc_desc *d)
{
	__u8 *buf = scratch_buf();
	if (!buf)
		return;
	struct rec_exec_enter *r = (void *)buf;
	fill_hdr(&r->h, REC_EXEC_ENTER, sc, cgid);
	__u32 fpos = d->pos[0]; /* the filename slot; argv is the next argument */
	if (fpos > 4)
		return;
	const char *fn = (const char *)s->args[fpos];
	const char *const *argv = (const char *const *)s->args[fpos + 1];
	__u32 off = sizeof(*r);
	long n = bpf_probe_read_user_str(buf + off, STR_MAX, fn);
	if (n <= 0) {
		buf[off] = 0;
		n = 1;
	}
	off += n;
	__u32 argc = 0;
	for (int i = 0; i < MAX_ARGV; i++) {
		const char *p = 0;
		if (bpf_probe_read_user(&p, sizeof(p), &argv[i]) || !p)
			break;
		off &= SCRATCH_MASK;
		n = bpf_probe_read_user_str(buf + off, STR_MAX, p);
		if (n <= 0)
			break;
		off += n;
		argc++;
	}
	r->argc = argc;
	r->pad = 0;
	emit(buf, off);
}

static __always_inline int on_enter(struct trace_event_raw_sys_enter *ctx, __u32 code)
{
	__u64 cgid = sandbox_cgid((struct task_struct *)bpf_get_current_task());
	if (!cgid)
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct corral_saved s = {.cgid = cgid};
	/* Copied, not read field by field: a direct read of args[5] would make the
	 * program unattachable to a tracepoint with fewer arguments (its record is
	 * shorter); the slots past the syscall's own arguments are never used. */
	bpf_probe_read_kernel(s.args, sizeof(s.args), ctx->args);
	bpf_map_update_elem(&inflight, &tid, &s, BPF_ANY);
	const struct sc_desc *d = bpf_map_lookup_elem(&descs, &code);
	if (d && (d->flags & DESC_EXEC))
		exec_enter(&s, code, cgid, d);
	return 0;
}

/* ------------------------------------------------------------ syscall at exit */

static __always_inline void exec_exit(long ret, __u16 sc, __u64 cgid)
{
	__u8 *buf = scratch_buf();
	if (!buf)
		return;
	struct rec_exec_exit *r = (void *)buf;
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	fill_hdr(&r->h, REC_EXEC_EXIT, sc, cgid);
	r->res = ret;
	r->ppid = BPF_CORE_READ(t, real_parent, tgid);
	r->loginuid = BPF_CORE_READ(t, loginuid.val);
	r->cap_effective = BPF_CORE_READ(t, cred, cap_effective.val);
	r->cap_permitted = BPF_CORE_READ(t, cred, cap_permitted.val);
	struct tty_struct *tty = BPF_CORE_READ(t, signal, tty);
	r->tty_major = 0;
	r->tty_minor = 0;
	if (tty) {
		r->tty_major = BPF_CORE_READ(tty, driver, major);
		r->tty_minor = BPF_CORE_READ(tty, driver, minor_start) + BPF_CORE_READ(tty, index);
	}
	r->pid_level = BPF_CORE_READ(t, thread_pid, level);
	r->has_exe = 0;
	r->exe_ino = 0;
	r->ctime_s = r->ctime_ns = r->mtime_s = r->mtime_ns = 0;
	__u32 off = sizeof(*r);
	if (exe_details && ret == 0) {
		struct file *exe = BPF_CORE_READ(t, mm, exe_file);
		if (exe) {
			struct inode *ino = BPF_CORE_READ(exe, f_inode);
			r->has_exe = 1;
			r->exe_ino = BPF_CORE_READ(ino, i_ino);
			if (bpf_core_field_exists(ino->i_ctime_sec)) {
				r->ctime_s = BPF_CORE_READ(ino, i_ctime_sec);
				r->ctime_ns = BPF_CORE_READ(ino, i_ctime_nsec);
				r->mtime_s = BPF_CORE_READ(ino, i_mtime_sec);
				r->mtime_ns = BPF_CORE_READ(ino, i_mtime_nsec);
			} else {
				struct inode___old *o = (void *)ino;
				r->ctime_s = BPF_CORE_READ(o, __i_ctime.tv_sec);
				r->ctime_ns = BPF_CORE_READ(o, __i_ctime.tv_nsec);
				r->mtime_s = BPF_CORE_READ(o, i_mtime.tv_sec);
				r->mtime_ns = BPF_CORE_READ(o, i_mtime.tv_nsec);
			}
			const unsigned char *name = BPF_CORE_READ(exe, f_path.dentry, d_name.name);
			long n = bpf_probe_read_kernel_str(buf + off, STR_MAX, name);
			if (n <= 0) {
				buf[off] = 0;
				n = 1;
			}
			off += n;
		}
	}
	emit(buf, off);
}

/* One REC_SYSCALL record from the saved arguments, by the syscall's descriptor. */
static __always_inline void syscall_record(const struct corral_saved *s, const struct sc_desc *d,
					   __u32 code, long ret)
{
	__u64 cgid = s->cgid;
	__u8 *buf = scratch_buf();
	if (!buf)
		return;
	struct rec_syscall *r = (void *)buf;
	fill_hdr(&r->h, REC_SYSCALL, code, cgid);
	r->res = ret;
	__u32 off = sizeof(*r);
	__u32 j = 0;
	__u8 cut = 0;
#pragma unroll
	for (int i = 0; i < N_SLOTS; i++) {
		if (i >= d->nslots || j >= N_VALS)
			break;
		__u32 pos = d->pos[i];
		if (pos > 5)
			pos = 5;
		__u64 a = s->args[pos];
		__u64 v = a;
		__u8 kind = d->kind[i];
		off &= 2047;
		if (kind == K_STR) {
			long n = bpf_probe_read_user_str(buf + off, STR_MAX, (const void *)a);
			if (n <= 0) {
				buf[off] = 0;
				n = 1;
			}
			if (n >= STR_MAX)
				cut |= 1 << i;
			v = n;
			off += n;
		} else if (kind == K_SOCKADDR || kind == K_PEER) {
			long len = 0;
			__u32 lpos = d->lenpos[i];
			if (lpos > 5)
				lpos = 5;
			__u64 l = s->args[lpos];
			if (kind == K_SOCKADDR) {
				len = (long)l;
			} else if (a && l) {
				int ul = 0;
				bpf_probe_read_user(&ul, sizeof(ul), (const void *)l);
				len = ul;
			}
			if (len > MAX_SOCKADDR || len < 0)
				len = MAX_SOCKADDR;
			if (kind == K_PEER && !a)
				len = 0;
			if (len > 0 && bpf_probe_read_user(buf + off, len & 127, (const void *)a))
				len = 0;
			v = len & 127;
			off += len & 127;
		} else if (kind == K_HOW) {
			__u64 how[2] = {0, 0};
			if (a)
				bpf_probe_read_user(how, sizeof(how), (const void *)a);
			if (j < N_VALS)
				r->v[j] = how[0];
			j++;
			v = how[1];
		} else {
			__u8 size = d->size[i];
			if (size == 4)
				v = (__u32)a;
			else if (size == 2)
				v = (__u16)a;
			else if (size == 1)
				v = (__u8)a;
		}
		if (j < N_VALS)
			r->v[j] = v;
		j++;
	}
#pragma unroll
	for (int k = 0; k < N_VALS; k++)
		if (k >= j)
			r->v[k] = 0;
	r->h.flags = cut;
	emit(buf, off);
}

static __always_inline int on_exit(struct trace_event_raw_sys_exit *ctx, __u32 code)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct corral_saved *s = bpf_map_lookup_elem(&inflight, &tid);
	if (!s)
		return 0;
	const struct sc_desc *d = bpf_map_lookup_elem(&descs, &code);
	long ret = ctx->ret;
	if (!d)
		goto out;
	if (d->flags & DESC_EXEC)
		exec_exit(ret, code, s->cgid);
	else
		syscall_record(s, d, code, ret);
out:
	bpf_map_delete_elem(&inflight, &tid);
	return 0;
}

/* ------------------------------------------------------------ calls seccomp denies */

/* Seccomp runs before sys_enter: a call the sandbox's profile denies (mount,
 * ptrace, setns, unshare, bpf, userfaultfd, the module calls) never reaches
 * the per-syscall enter tracepoint, so nothing is saved for its exit. The raw
 * sys_exit tracepoint still fires for it; for the syscall numbers in raw_nrs (given by
 * the loader, whose per-syscall programs it then leaves out: one record per
 * call) this writes the record the exit program would, with the arguments
 * read from the caller's registers (still the call's: seccomp changed only
 * the return value) and the return value -EPERM. x86_64 only (the register
 * names and numbers are that ABI's). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, RAW_NR_MAX);
	__type(key, __u32);
	__type(value, __u32); /* program.CODES of the syscall, 0: not watched */
} raw_nrs SEC(".maps");

#if defined(__TARGET_ARCH_x86)
#define TS_COMPAT_BIT 0x0002 /* arch/x86/include/asm/thread_info.h: TS_COMPAT */

SEC("raw_tracepoint/sys_exit")
int on_raw_exit(struct bpf_raw_tracepoint_args *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	long ret = (long)ctx->args[1];
	long nr = BPF_CORE_READ(regs, orig_ax);
	if (nr < 0 || nr >= RAW_NR_MAX)
		return 0;
	__u32 key = (__u32)nr;
	__u32 *code = bpf_map_lookup_elem(&raw_nrs, &key);
	if (!code || !*code)
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	/* A 32-bit (int 0x80) call numbers syscalls another way: not these. */
	if (bpf_core_field_exists(task->thread_info.status) &&
	    (BPF_CORE_READ(task, thread_info.status) & TS_COMPAT_BIT))
		return 0;
	__u64 cgid = sandbox_cgid(task);
	if (!cgid)
		return 0;
	__u32 c = *code;
	const struct sc_desc *d = bpf_map_lookup_elem(&descs, &c);
	if (!d || (d->flags & DESC_EXEC))
		return 0;
	struct corral_saved s = {.cgid = cgid};
	s.args[0] = BPF_CORE_READ(regs, di);
	s.args[1] = BPF_CORE_READ(regs, si);
	s.args[2] = BPF_CORE_READ(regs, dx);
	s.args[3] = BPF_CORE_READ(regs, r10);
	s.args[4] = BPF_CORE_READ(regs, r8);
	s.args[5] = BPF_CORE_READ(regs, r9);
	syscall_record(&s, d, c, ret);
	return 0;
}
#endif

/* ------------------------------------------------------------ sched */

SEC("tp/sched/sched_process_fork")
int on_fork(struct trace_event_raw_sched_process_fork *ctx)
{
	__u64 cgid = sandbox_cgid((struct task_struct *)bpf_get_current_task());
	if (!cgid)
		return 0;
	struct rec_fork r;
	fill_hdr(&r.h, REC_FORK, 0, cgid);
	r.child_tid = ctx->child_pid;
	r.pad = 0;
	r.h.size = sizeof(r);
	if (bpf_ringbuf_output(&events, &r, sizeof(r), BPF_RB_NO_WAKEUP))
		count_lost();
	return 0;
}

SEC("tp/sched/sched_process_exit")
int on_task_exit(void *ctx)
{
	struct task_struct *t = (struct task_struct *)bpf_get_current_task();
	__u64 cgid = sandbox_cgid(t);
	if (!cgid)
		return 0;
	struct rec_exit r;
	fill_hdr(&r.h, REC_EXIT, 0, cgid);
	r.exit_code = BPF_CORE_READ(t, exit_code);
	r.h.size = sizeof(r);
	if (bpf_ringbuf_output(&events, &r, sizeof(r), BPF_RB_NO_WAKEUP))
		count_lost();
	return 0;
}

/* ------------------------------------------------------------ one pair per syscall */

enum {
	CODE_NONE = 0,
#define SC(name) CODE_##name,
#include "syscalls.h"
#undef SC
};

#define SC(name)                                                                   \
	SEC("tp/syscalls/sys_enter_" #name)                                        \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)                    \
	{                                                                          \
		return on_enter(ctx, CODE_##name);                                 \
	}                                                                          \
	SEC("tp/syscalls/sys_exit_" #name)                                         \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                      \
	{                                                                          \
		return on_exit(ctx, CODE_##name);                                  \
	}
#include "syscalls.h"
#undef SC
