/* launch_proc.h: the processes pmap-launch runs (tools/pmap-launch.c): a command started in a
 * session of its own, its output read through pipes while it runs, and every process it leaves
 * behind on this machine ended before the launcher goes on. Linux: /proc and a child subreaper. */
#ifndef PMAP_TOOLS_LAUNCH_PROC_H
#define PMAP_TOOLS_LAUNCH_PROC_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#define PROC_MAX_LISTED 16 /* pids named in a report */

/* One output stream of a command: copied on, its last bytes kept, a text looked for. */
typedef struct proc_stream {
  int fd;      /* the read end; -1 once at its end */
  int copy_to; /* also written there (1, 2), -1: nowhere */
  char *keep;  /* the last keep_cap bytes read (NULL: none kept) */
  size_t kept, keep_cap;
  const char *mark; /* a text to look for (optional): *marked once it was read */
  int marked;
  char carry[64]; /* the end of the previous read, so that a mark split across reads is found */
  size_t ncarry;
  size_t total; /* bytes read */
} proc_stream;

typedef struct proc {
  pid_t pid;  /* the command, the leader of its session; 0 once it was waited for */
  pid_t sid;  /* its session */
  int status; /* its wait status */
  proc_stream out, err;
} proc;

/* What proc_end found and did. */
typedef struct proc_ending {
  int found;                  /* processes that outlived the command */
  pid_t pid[PROC_MAX_LISTED]; /* the first of them */
  int killed;                 /* 1 when some needed SIGKILL after the grace */
  int left;                   /* processes still there at the end (0 unless it failed; -1:
                                    /proc could not be read) */
  double took;                /* seconds until the last one was gone */
} proc_ending;

/* Makes this process the subreaper of its descendants (orphans come to it, not to init), and
 * ignores SIGPIPE (a closed output must not end the launcher). Call once at start. */
void proc_init(void);

/* Starts argv (searched on the PATH) with the environment envp, its standard input /dev/null,
 * its standard output and error read by p, as the leader of a new session, and sent SIGTERM if
 * the launcher dies. p->out and p->err's copy_to, keep_cap and mark are the caller's (set
 * before). Returns 0, or -1 with why filled. */
int proc_start(proc *p, char *const argv[], char *const envp[], char *why, size_t why_size);

/* Reads p's output and waits for the command to end: returns 0 when it ended (p->status), 1 at
 * the monotonic time deadline (cli_now), 2 once *stop is set (by a signal handler). */
int proc_wait(proc *p, double deadline, volatile sig_atomic_t *stop);

/* Ends a command that is still running: SIGTERM, and SIGKILL after grace seconds; waits for it. */
void proc_stop(proc *p, double grace);

/* After the command ended: finds every process of its session and every orphan handed to this
 * process, sends them SIGTERM (and SIGCONT, for a stopped one), SIGKILL those left after grace
 * seconds, and waits until none is left (at most 10 s more), reading the output meanwhile.
 * Returns 0 when none is left, -1 otherwise (e->left). */
int proc_end(proc *p, double grace, proc_ending *e);

/* Reads what is left of p's output (until its end, or 1 s without data) and closes it. */
void proc_close(proc *p);
/* Frees what p kept of its output (after proc_close). */
void proc_free(proc *p);

/* Whether name (a path with a '/', else searched on the PATH) is an executable file. */
int proc_found(const char *name);

#endif
