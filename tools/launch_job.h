/* launch_job.h: what pmap-launch (tools/pmap-launch.c) runs and decides from: the job's command
 * line and environment, the program's --save and --resume, why a run failed in one line, and
 * the checkpoint a restart resumes from (tools/launch_job.c). */
#ifndef PMAP_TOOLS_LAUNCH_JOB_H
#define PMAP_TOOLS_LAUNCH_JOB_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

typedef struct launch {
  int64_t np, restart_np, max_restarts;
  const char *mpirun, *log;
  float backoff;
  const char **mpirun_args; /* --mpirun-arg values, in order */
  int n_mpirun_args;
  int have_restart_np;
  char **prog; /* the program and its arguments, as given after -- */
  int nprog;
  const char **args; /* prog[1..] without any --resume and its value */
  int nargs;
  const char *save;         /* the program's --save FILE (the last one given) */
  const char *first_resume; /* the program's --resume, for the first run (NULL: none) */
  int have_save_every;
  int log_fd; /* --log's file, -1 without */
} launch;

/* The launcher's log (a line, timestamped, on stderr and into --log's file). */
typedef void (*launch_say)(const launch *L, const char *fmt, ...);

/* Reads the program's --save, --save-every and --resume (each takes the next argument) into L:
 * 0, or -1 after cli_error (a missing value, no --save). */
int launch_program_args(launch *L);

/* mpirun -np NP [mpirun args] program args [--resume resume]: NULL-terminated, malloc'ed (the
 * strings are L's and the arguments'); NULL when out of memory. */
char **launch_job_argv(const launch *L, const char *np, const char *resume);

/* The launcher's environment without PMAP_LAUNCH_ATTEMPT (clean: without any PMAP_* variable),
 * plus extra ("NAME=value", kept by the caller); malloc'ed, NULL when out of memory. */
char **launch_env(const char *extra, int clean);

/* argv joined by spaces into buf (cut at size). */
void launch_join(char *const *argv, char *buf, size_t size);

/* Why a run failed, in a line: how mpirun ended (wait_status) and at most 4 lines of its
 * standard error err[0..n) that say which process ended how: the program's own messages first,
 * then mpirun's, then the program's messages that only report another process's end. */
void launch_why_failed(const char *err, size_t n, int wait_status, char *buf, size_t size);

/* The signal that ended the run: mpirun's own, or a process's (mpirun's status 128 + S with a
 * line of err[0..n) naming a signal); 0 when none did. */
int launch_signal_of(const char *err, size_t n, int wait_status);
/* That signal when it is one sent from outside (SIGKILL, SIGTERM, SIGHUP, SIGINT, SIGQUIT: a
 * preemption, the out-of-memory killer, a person), also where mpirun's status 128 + S alone says
 * so; 0 otherwise (none, or a crash: SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, ...). */
int launch_outside_signal(const char *err, size_t n, int wait_status);

/* Whether a process of the program said itself why it failed (a line of err[0..n) that starts
 * with "pmap-train: "): mpirun's own failures and a process killed or crashed say nothing. */
int launch_reported(const char *err, size_t n);

/* Checks FILE and every FILE.tmp.* beside it (beside the file a symbolic link FILE names) with
 * the program's --inspect, run alone, and picks the one at the latest step: *path (malloc'ed;
 * NULL when none loads), *step and *last, the job's last step as the check says (its --steps;
 * -1 when not said). A FILE.tmp.* picked is renamed to FILE first, and *path is FILE. Logs each
 * file skipped. Returns 0, or -1 when *stop was set meanwhile. */
int launch_newest(const launch *L, launch_say say, volatile sig_atomic_t *stop, int64_t *step,
                  int64_t *last, char **path);

#endif
