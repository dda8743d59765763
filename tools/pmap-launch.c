/* pmap-launch: runs a pmap-train job under mpirun and, when the job fails (a process killed, a
 * machine lost, a timeout), starts it again from its newest checkpoint that loads, up to N
 * times, optionally on fewer processes, once every process of the failed run is gone. Its log
 * says why each restart happened. See docs/distributed.md, "Restarting failed jobs". */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "launch_job.h"
#include "launch_proc.h"

static const char *prog = "pmap-launch";

#define GRACE_S 3.0 /* from SIGTERM to SIGKILL for what outlives a run */
/* Printed by pmap-train (process 0) once its options, data, devices and processes are set up,
 * before its first step: a run that crashes before it crashes at the start. */
#define HEADER "pmap-train: model "
/* Written by every pmap-train process that fails as given (its arguments, data, model, devices,
 * --save path wrong), which then exits with status 2: a restart would fail alike. mpirun's status
 * is the first failing process's, which may be another that failed because this one did. */
#define AS_GIVEN "pmap-train: exit status 2: "

static volatile sig_atomic_t stop_sig;
static void on_signal(int sig) { stop_sig = sig; }

static launch *the; /* for the --mpirun-arg check, which appends */

static int add_mpirun_arg(const char *p, const cli_option *o, const char *v) {
  (void)p, (void)o;
  the->mpirun_args[the->n_mpirun_args++] = v;
  return 0;
}

static int backoff_check(const char *p, const cli_option *o, const char *v) {
  float b = *(const float *)o->dest;
  if (!(b >= 0.0f) || !isfinite(b))
    return cli_error(p, "--backoff \"%s\" is not a number of seconds >= 0", v);
  return 0;
}

static const char usage[] =
    "usage: pmap-launch [--np P] [--restart-np P2] [--max-restarts N] [--mpirun CMD]\n"
    "                   [--mpirun-arg ARG]... [--backoff S] [--log FILE] -- pmap-train ARGS...\n";

static const char about[] =
    "Runs CMD -np P [ARG...] pmap-train ARGS...; ARGS must include --save FILE (and should "
    "include --save-every K). When the job fails it is started again with --resume set to the "
    "newest checkpoint that loads in full (FILE, or a complete FILE.tmp.* a save left behind "
    "when it was killed between writing and renaming; each checked with pmap-train ARGS "
    "--inspect, run alone: one CPU device, PMAP_DIST=none and none of the job's PMAP_* "
    "variables), or from the start when none does.";

static const char notes[] =
    "Each run gets PMAP_LAUNCH_ATTEMPT=k in its environment (0 for the first run); its standard "
    "input is /dev/null.\n"
    "Restarted: a run that fails (a process killed, stopped, failed or late to start, a machine "
    "lost, a timeout, mpirun killed). Not restarted: a run whose pmap-train processes say that "
    "what it was given is wrong (\"pmap-train: exit status 2: ...\": its arguments, data, "
    "model, devices or --save path), and a first run that ends before pmap-train's header line "
    "(\"pmap-train: model ...\") without a word of pmap-train's (mpirun's own arguments, the "
    "program) or by a crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT or any signal but SIGKILL, "
    "SIGTERM, SIGHUP, SIGINT and SIGQUIT, which a preemption or the out-of-memory killer sends): "
    "a restart would fail alike. A failed run whose newest checkpoint holds the last step ends "
    "the job with success (a process that never ended after the last save).\n"
    "Before a checkpoint is chosen every process of the failed run on this machine is gone: "
    "those that outlived mpirun (in its session, or orphans) get SIGTERM, and SIGKILL after 3 s. "
    "A --resume F in ARGS is the first run's: restarts replace it with the checkpoint chosen, or "
    "use F again when none loads. A FILE.tmp.* chosen is renamed to FILE first (it is a save "
    "cut short); other FILE.tmp.* files are left as they are.\n"
    "Log lines: \"run K (of at most N+1): CMD\", \"run K failed after T s with status S: WHY\", "
    "\"run K: every process of it has ended\" (or how many outlived mpirun and how they were "
    "ended), \"checkpoint F does not load; skipped: WHY\", \"restart K of N on P processes, "
    "from F (step S)\" or \"... from the start (no checkpoint loads)\", \"run K finished in T "
    "s\", \"run K: checkpoint F holds step S of S, the last: the job is complete\", \"giving up "
    "after N restarts\".\n"
    "Exit status: 0 once a run succeeds, or a failed run's checkpoint holds the last step; 2 when "
    "the arguments are wrong (nothing was run); "
    "128+S when interrupted by signal S (the job is stopped, not restarted); else the last "
    "run's: mpirun's status, 128+S when mpirun itself ended by signal S.";

/* The usage above, then cli_help's text without its own synopsis (which cannot show the
 * program after --). */
static void help(const cli_spec *spec) {
  char *text = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&text, &size);
  if (!f) return;
  cli_help(spec, f);
  fclose(f);
  const char *p = strchr(text, '\n');
  while (p && p[1] == ' ') p = strchr(p + 1, '\n');
  fputs(usage, stdout);
  if (p) fputs(p + 1, stdout);
  free(text);
}

/* Reads pmap-launch's options (before --) and the program's --save, --save-every and --resume.
 * Returns 0, 1 after --help, -1 after an error message. */
static int parse(int argc, char **argv, launch *L) {
  *L = (launch){.np = 1, .max_restarts = 3, .mpirun = "mpirun", .backoff = 1.0f, .log_fd = -1};
  L->mpirun_args = calloc((size_t)argc + 1, sizeof *L->mpirun_args);
  if (!L->mpirun_args) return cli_error(prog, "out of memory");
  the = L;
  const char *scratch = NULL;
  const cli_option table[] = {
      {.name = "--np",
       .kind = CLI_INT,
       .dest = &L->np,
       .arg = "P",
       .lo = 1,
       .hi = 1 << 20,
       .help = "processes of the first run (default 1)"},
      {.name = "--restart-np",
       .kind = CLI_INT,
       .dest = &L->restart_np,
       .arg = "P2",
       .lo = 1,
       .hi = 1 << 20,
       .given = &L->have_restart_np,
       .help = "processes of every restart (default P): fewer when a machine is gone "
               "(checkpoints load on any layout; the global batch must still divide)"},
      {.name = "--max-restarts",
       .kind = CLI_INT,
       .dest = &L->max_restarts,
       .arg = "N",
       .lo = 0,
       .hi = 1000000,
       .help = "restarts at most (default 3)"},
      {.name = "--mpirun",
       .kind = CLI_STRING,
       .dest = &L->mpirun,
       .arg = "CMD",
       .help = "the MPI launcher (default mpirun)"},
      {.name = "--mpirun-arg",
       .kind = CLI_STRING,
       .dest = &scratch,
       .arg = "ARG",
       .check = add_mpirun_arg,
       .help = "one more argument for the launcher, before the program (repeat it): "
               "--mpirun-arg --hostfile --mpirun-arg hosts"},
      {.name = "--backoff",
       .kind = CLI_FLOAT,
       .dest = &L->backoff,
       .arg = "S",
       .check = backoff_check,
       .help = "seconds to wait before a restart (default 1)"},
      {.name = "--log",
       .kind = CLI_STRING,
       .dest = &L->log,
       .arg = "FILE",
       .help = "also append the launcher's log lines to FILE (its folder must exist)"},
  };
  const int count = (int)(sizeof table / sizeof table[0]);
  const cli_spec spec = {prog, table, count, about, notes};
  /* The options end at the first "--" (an option just before it has no value). */
  int split = argc;
  for (int i = 1; i < argc && split == argc; i++)
    if (!strcmp(argv[i], "--")) split = i;
  for (int i = 1; i < split; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      help(&spec);
      return 1;
    }
    for (int k = 0; k < count; k++)
      if (!strcmp(argv[i], table[k].name)) {
        i += table[k].kind != CLI_FLAG;
        break;
      }
  }
  if (cli_parse(&spec, split, argv)) return -1;
  if (!L->have_restart_np) L->restart_np = L->np;
  if (split + 1 >= argc) return cli_error(prog, "no program after -- (see --help)");
  L->prog = argv + split + 1;
  L->nprog = argc - split - 1;
  return launch_program_args(L);
}

static void say(const launch *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const launch *L, const char *fmt, ...) {
  char line[8192];
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  int n = snprintf(line, sizeof line, "%s: ", prog);
  n += (int)strftime(line + n, sizeof line - (size_t)n, "%Y-%m-%d %H:%M:%S ", &tm);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(line);
  line[len++] = '\n';
  /* One write per line: the log reads in order beside the job's own output. */
  if (write(2, line, len) < 0) (void)0;
  if (L->log_fd >= 0 && write(L->log_fd, line, len) < 0) (void)0;
}

/* Logs what outlived run k and how it was ended (quiet: only when something did). */
static int end_run(const launch *L, proc *p, int k, int quiet) {
  proc_ending e;
  int rc = proc_end(p, GRACE_S, &e);
  if (e.left < 0) {
    say(L,
        "run %d: /proc cannot be read, so its processes cannot be made sure to be gone: not "
        "going on",
        k);
    return -1;
  }
  if (!e.found) {
    if (!quiet) say(L, "run %d: every process of it has ended", k);
    return 0;
  }
  char pids[256] = "";
  size_t len = 0;
  for (int i = 0; i < e.found && i < PROC_MAX_LISTED && len < sizeof pids; i++)
    len += (size_t)snprintf(pids + len, sizeof pids - len, "%s%d", i ? ", " : "", (int)e.pid[i]);
  if (rc)
    say(L,
        "run %d: %d processes outlived mpirun (PIDs %s%s); %d are still there after SIGTERM "
        "and SIGKILL: not going on (two runs could write one checkpoint)",
        k, e.found, pids, e.found > PROC_MAX_LISTED ? ", ..." : "", e.left);
  else
    say(L, "run %d: %d processes outlived mpirun (PIDs %s%s): %s; all gone after %.1f s", k,
        e.found, pids, e.found > PROC_MAX_LISTED ? ", ..." : "",
        e.killed ? "sent SIGTERM, then SIGKILL after the 3 s grace" : "ended by SIGTERM", e.took);
  return rc;
}

/* Sleeps s seconds unless a signal stops the launcher: returns 0, or the signal. */
static int pause_for(double s) {
  double end = cli_now() + s;
  while (!stop_sig && cli_now() < end) {
    double left = end - cli_now();
    struct timespec ts = {0, (long)((left < 0.1 ? left : 0.1) * 1e9)};
    nanosleep(&ts, NULL);
  }
  return stop_sig;
}

/* The status of a run from mpirun's wait status, as a shell reports it. */
static int status_of(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

/* Runs attempt k (0 the first); returns its status, or -1 when the launcher must stop without
 * a restart (*rc then the exit status). */
static int run_once(launch *L, int k, int procs, const char *resume, int *rc) {
  char np[32], attempt[64];
  snprintf(np, sizeof np, "%d", procs);
  snprintf(attempt, sizeof attempt, "PMAP_LAUNCH_ATTEMPT=%d", k);
  char **argv = launch_job_argv(L, np, resume);
  char **envp = launch_env(attempt, 0);
  if (!argv || !envp) {
    say(L, "out of memory");
    *rc = 1;
    free(argv);
    free(envp);
    return -1;
  }
  char cmd[8192];
  launch_join(argv, cmd, sizeof cmd);
  say(L, "run %d (of at most %d): %s", k + 1, (int)L->max_restarts + 1, cmd);
  proc p = {.out = {.copy_to = 1, .mark = HEADER},
            .err = {.copy_to = 2, .keep_cap = 1 << 18, .mark = AS_GIVEN}};
  char why[1024];
  double t0 = cli_now();
  int started = proc_start(&p, argv, envp, why, sizeof why);
  free(argv);
  free(envp);
  if (started) {
    say(L, "%s", why);
    *rc = 1;
    return -1;
  }
  if (proc_wait(&p, INFINITY, &stop_sig) == 2) {
    say(L, "interrupted by signal %d: stopping the job (no restart)", (int)stop_sig);
    proc_stop(&p, GRACE_S);
    end_run(L, &p, k + 1, 1);
    proc_close(&p);
    proc_free(&p);
    *rc = 128 + stop_sig;
    return -1;
  }
  double took = cli_now() - t0;
  int status = status_of(p.status);
  if (status == 0) {
    int left = end_run(L, &p, k + 1, 1);
    proc_close(&p);
    proc_free(&p);
    say(L, "run %d finished in %.0f s", k + 1, took);
    *rc = 0;
    return left ? -1 : 0;
  }
  char reason[2048];
  launch_why_failed(p.err.keep, p.err.kept, p.status, reason, sizeof reason);
  int sig = launch_signal_of(p.err.keep, p.err.kept, p.status);
  int outside = launch_outside_signal(p.err.keep, p.err.kept, p.status);
  int reported = launch_reported(p.err.keep, p.err.kept);
  say(L, "run %d failed after %.0f s with status %d: %s", k + 1, took, status, reason);
  int left = end_run(L, &p, k + 1, 0);
  proc_close(&p);
  proc_free(&p);
  int began = p.out.marked;
  *rc = status;
  if (left) return -1;
  /* Whether a restart would fail alike: pmap-train says so (AS_GIVEN); a failure it reported
   * otherwise (a process late at the start, a timeout, a step) is the run's own. Where it said
   * nothing (a crash, mpirun's own failure) the first run's start decides: a crash or a failure
   * before training began would come again. */
  if (p.err.marked) {
    say(L,
        "run %d ended as pmap-train cannot run as given (\"%s2\": its arguments, data, model, "
        "devices or --save path are wrong): not restarted, a restart would fail alike",
        k + 1, AS_GIVEN);
    return -1;
  }
  if (k == 0 && !began && outside) {
    say(L,
        "run 1 ended by signal %d (%s) before pmap-train began training: a signal sent from "
        "outside (a preemption, the out-of-memory killer, a person), not a fault of the job: "
        "restarted",
        outside, strsignal(outside));
  } else if (k == 0 && !began && (sig || !reported)) {
    char how[96] = "";
    if (sig) snprintf(how, sizeof how, ", by signal %d (%s)", sig, strsignal(sig));
    say(L,
        "run 1 ended before pmap-train began training (no \"%.*s\" line)%s, and pmap-train "
        "said nothing of it: not restarted, a restart would fail alike (check the program, "
        "mpirun's arguments and the processes' start)",
        (int)strlen(HEADER) - 1, HEADER, how);
    return -1;
  }
  return status;
}

int main(int argc, char **argv) {
  launch L;
  int r = parse(argc, argv, &L);
  if (r) {
    free(L.mpirun_args);
    free(L.args);
    return r > 0 ? 0 : 2;
  }
  int code = 2;
  if (L.log && (L.log_fd = open(L.log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644)) < 0) {
    cli_error(prog, "--log \"%s\": cannot open it: %s", L.log, strerror(errno));
    goto out;
  }
  if (!proc_found(L.mpirun)) {
    cli_error(prog, "no MPI launcher \"%s\" (--mpirun CMD)", L.mpirun);
    goto out;
  }
  if (!proc_found(L.prog[0])) {
    cli_error(prog, "no program \"%s\" to run (not an executable file, nor on the PATH)",
              L.prog[0]);
    goto out;
  }
  proc_init();
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  if (!L.have_save_every)
    say(&L, "warning: no --save-every: a restart can only resume from a finished run's save");
  const char *resume = L.first_resume;
  char *chosen = NULL;
  int procs = (int)L.np;
  for (int k = 0;; k++) {
    int status = run_once(&L, k, procs, resume, &code);
    if (status <= 0) break;
    procs = (int)L.restart_np;
    int64_t step = -1, last = -1;
    free(chosen);
    chosen = NULL;
    if (launch_newest(&L, say, &stop_sig, &step, &last, &chosen)) {
      say(&L, "interrupted by signal %d: not restarting", (int)stop_sig);
      code = 128 + stop_sig;
      break;
    }
    /* The run failed after its last save (a process that never ended, say): nothing is left to
     * do. */
    if (chosen && last >= 0 && step >= last) {
      say(&L, "run %d: checkpoint %s holds step %lld of %lld, the last: the job is complete", k + 1,
          chosen, (long long)step, (long long)last);
      code = 0;
      break;
    }
    if (k >= L.max_restarts) {
      say(&L, "giving up after %d restarts", (int)L.max_restarts);
      break;
    }
    if (chosen)
      say(&L, "restart %d of %d on %d processes, from %s (step %lld)", k + 1, (int)L.max_restarts,
          procs, chosen, (long long)step);
    else if (L.first_resume)
      say(&L,
          "restart %d of %d on %d processes, from %s (the first run's --resume: no "
          "checkpoint loads)",
          k + 1, (int)L.max_restarts, procs, L.first_resume);
    else
      say(&L, "restart %d of %d on %d processes, from the start (no checkpoint loads)", k + 1,
          (int)L.max_restarts, procs);
    resume = chosen ? chosen : L.first_resume;
    if (pause_for(L.backoff)) {
      say(&L, "interrupted by signal %d: not restarting", (int)stop_sig);
      code = 128 + stop_sig;
      break;
    }
  }
  free(chosen);
out:
  if (L.log_fd >= 0) close(L.log_fd);
  free(L.mpirun_args);
  free(L.args);
  return code;
}
