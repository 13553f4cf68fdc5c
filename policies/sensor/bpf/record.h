/* Binary records shared by sensor.bpf.c and loader.c; parsed by
 * policies/sensor/binparser.py (keep the three in step). Little endian,
 * every record starts with struct rec_hdr whose `size` is the record's
 * length in bytes: the stream on the loader's stdout is records back to back. */
#ifndef CORRAL_SENSOR_RECORD_H
#define CORRAL_SENSOR_RECORD_H

#define STR_MAX 256      /* bytes read per string, NUL included */
#define MAX_ARGV 20      /* argv entries per execve (program.MAX_ARGV) */
#define MAX_SOCKADDR 112 /* bytes of a sockaddr (program.MAX_SOCKADDR) */
#define N_SLOTS 5        /* arguments per syscall (program.N_ARG_MAPS) */
#define N_VALS 6         /* values per syscall record: a HOW slot takes two */
#define SCRATCH 16384    /* per-CPU record buffer */
#define SCRATCH_MASK 8191

/* Record codes: the same numbers as policies/sensor/program.py's REC_*. */
#define REC_SYSCALL 1
#define REC_EXEC_ENTER 2
#define REC_EXEC_EXIT 4
#define REC_FORK 5
#define REC_EXIT 6
#define REC_ATTACHED 9 /* from the loader: every program is attached */
#define REC_LOST 10    /* from the loader: records the ring buffer had no room for */
#define REC_TICK 11    /* from the loader: every record before `tick N` was written */

#define RAW_NR_MAX 512 /* syscall numbers the raw sys_exit program can watch */

/* Argument kinds (program.py: INT, STR, SOCKADDR, PEER, HOW). */
#define K_INT 0
#define K_STR 1
#define K_SOCKADDR 2
#define K_PEER 3
#define K_HOW 4

#define DESC_EXEC 1 /* execve/execveat: filename and argv at enter */

struct rec_hdr {
	__u16 size;
	__u8 code;
	__u8 flags; /* REC_SYSCALL: bit i = slot i's string was cut at STR_MAX */
	__u16 sc;   /* program.CODES[name] of the syscall, 0 for sched records */
	__u16 pad;
	__u32 tid;
	__u32 pid;
	__u64 ts;   /* bpf_ktime_get_ns */
	__u64 cgid; /* kernfs id of the task's leaf cgroup (the sandbox) */
	__u32 uid;
	__u32 gid;
	char comm[16];
};

/* REC_SYSCALL: v[] holds one value per slot (two for HOW: flags, mode); a
 * STR, SOCKADDR or PEER slot's value is the length of its bytes, which follow
 * the record in slot order (a STR's length counts its NUL). */
struct rec_syscall {
	struct rec_hdr h;
	__s64 res;
	__u64 v[N_VALS];
};

/* REC_EXEC_ENTER: filename then up to MAX_ARGV argv entries follow, each
 * NUL-terminated; argc says how many argv entries. */
struct rec_exec_enter {
	struct rec_hdr h;
	__u32 argc;
	__u32 pad;
};

/* REC_EXEC_EXIT: the new image; the exe's name (NUL-terminated) follows
 * when has_exe. */
struct rec_exec_exit {
	struct rec_hdr h;
	__s64 res;
	__u32 ppid;
	__u32 loginuid;
	__u64 cap_effective;
	__u64 cap_permitted;
	__u32 tty_major;
	__u32 tty_minor;
	__u32 pid_level;
	__u32 has_exe;
	__u64 exe_ino;
	__s64 ctime_s;
	__s64 ctime_ns;
	__s64 mtime_s;
	__s64 mtime_ns;
};

struct rec_fork {
	struct rec_hdr h;
	__u32 child_tid;
	__u32 pad;
};

struct rec_exit {
	struct rec_hdr h;
	__s64 exit_code;
};

struct rec_lost {
	struct rec_hdr h;
	__u64 lost; /* since the previous REC_LOST */
};

/* The answer to a `tick N` line on the loader's stdin: written after the ring
 * buffer was drained, so every record the kernel wrote before the line came
 * precedes it in the stream. */
struct rec_tick {
	struct rec_hdr h;
	__u64 n;
};

/* Per-syscall argument layout, filled by the loader from its command line. */
struct sc_desc {
	__u8 nslots;
	__u8 flags;
	__u8 kind[N_SLOTS];
	__u8 pos[N_SLOTS];    /* index of the tracepoint argument */
	__u8 lenpos[N_SLOTS]; /* SOCKADDR/PEER: index of the length argument */
	__u8 size[N_SLOTS];   /* INT: bytes of the argument's C type (1, 2, 4 or 8) */
};

#endif
