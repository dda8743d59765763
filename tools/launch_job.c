/* launch_job.c: the job pmap-launch runs and the checkpoint it restarts from (launch_job.h). A
 * checkpoint is checked by the program itself (--inspect), alone: one CPU device, no MPI, and
 * none of the job's PMAP_* variables, so that a fault or trace set for the job cannot fail it. */
#include "launch_job.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "launch_proc.h"

extern char **environ;

static const char *prog = "pmap-launch";

#define CHECK_LIMIT_S 600.0 /* a check that takes longer is stopped and its file skipped */

int launch_program_args(launch *L) {
  L->args = calloc((size_t)L->nprog + 1, sizeof *L->args);
  if (!L->args) return cli_error(prog, "out of memory");
  for (int i = 1; i < L->nprog; i++) {
    const char *a = L->prog[i];
    int save = !strcmp(a, "--save"), every = !strcmp(a, "--save-every");
    int resume = !strcmp(a, "--resume");
    if ((save || every || resume) && i + 1 >= L->nprog)
      return cli_error(prog, "the program's %s needs a value (%s)", a,
                       save     ? "--save FILE, the checkpoint restarts resume from"
                       : resume ? "--resume FILE"
                                : "--save-every K");
    if (resume) {
      L->first_resume = L->prog[++i];
      continue;
    }
    L->args[L->nargs++] = a;
    if (save || every) {
      if (save) L->save = L->prog[i + 1];
      if (every) L->have_save_every = 1;
      L->args[L->nargs++] = L->prog[++i];
    }
  }
  if (!L->save || !*L->save)
    return cli_error(prog,
                     "the program's arguments need --save FILE (the checkpoint restarts resume "
                     "from)");
  return 0;
}

char **launch_job_argv(const launch *L, const char *np, const char *resume) {
  size_t n = 3 + (size_t)L->n_mpirun_args + 1 + (size_t)L->nargs + 2 + 1;
  char **v = calloc(n, sizeof *v);
  if (!v) return NULL;
  size_t k = 0;
  v[k++] = (char *)L->mpirun;
  v[k++] = "-np";
  v[k++] = (char *)np;
  for (int i = 0; i < L->n_mpirun_args; i++) v[k++] = (char *)L->mpirun_args[i];
  v[k++] = L->prog[0];
  for (int i = 0; i < L->nargs; i++) v[k++] = (char *)L->args[i];
  if (resume) {
    v[k++] = "--resume";
    v[k++] = (char *)resume;
  }
  return v;
}

char **launch_env(const char *extra, int clean) {
  size_t n = 0;
  while (environ[n]) n++;
  char **v = calloc(n + 2, sizeof *v);
  if (!v) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const char *e = environ[i];
    if (clean ? !strncmp(e, "PMAP_", 5) : !strncmp(e, "PMAP_LAUNCH_ATTEMPT=", 20)) continue;
    v[k++] = environ[i];
  }
  v[k] = (char *)extra;
  return v;
}

void launch_join(char *const *argv, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; argv[i] && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? " " : "", argv[i]);
}

/* mpirun's lines that say what ended how, and the program's own messages. */
static const char *const telling[] = {"noticed that process rank",
                                      "exited on signal",
                                      "pmap-train: ",
                                      "pmap: process ",
                                      "pmap-launch: ",
                                      "exiting improperly",
                                      "Exit code:",
                                      "killed",
                                      "Killed",
                                      "unable to",
                                      "failed to start",
                                      "Error:",
                                      NULL};

/* The program's message that only reports the end of another process, which the runtime words
 * "process K (...) destroyed its context after N collectives" (or "ended with its context
 * open", "gave up"): the failing process said why itself, in a line of its own. */
static int reports_another(const char *s, size_t l) {
  static const char *const ends[] = {"destroyed its context after ",
                                     "ended with its context open after ", "gave up after ", NULL};
  if (l < 12 || memcmp(s, "pmap-train: ", 12)) return 0;
  for (int k = 0; ends[k]; k++)
    if (memmem(s, l, ends[k], strlen(ends[k]))) return 1;
  return 0;
}

#define WHY_LINES 4   /* lines in a reason */
#define SEEN_LINES 16 /* telling lines looked at */

/* pmap-train's notes on stderr (the backend auto chose, a trace window): what it ran with, not
 * a reason for how it ended. */
static int train_note(const char *s, size_t l) {
  return (l >= 30 && !memcmp(s, "pmap-train: backend auto chose", 30)) ||
         (l >= 18 && !memcmp(s, "pmap-train: note: ", 18));
}

/* The telling lines of err[0..n), trimmed and without repeats, at most SEEN_LINES: lines[i] of
 * lens[i] bytes; *any_signal when one of them names a signal. Returns the count. */
static int telling_lines(const char *err, size_t n, const char **lines, size_t *lens,
                         int *any_signal) {
  int nl = 0;
  *any_signal = 0;
  for (const char *p = err, *end = err + n; p < end && nl < SEEN_LINES;) {
    const char *nlp = memchr(p, '\n', (size_t)(end - p));
    const char *e = nlp ? nlp : end;
    const char *s = p;
    p = nlp ? nlp + 1 : end;
    while (s < e && (*s == ' ' || *s == '\t')) s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\r' || e[-1] == '\t')) e--;
    size_t l = (size_t)(e - s);
    int tells = 0;
    for (int k = 0; telling[k] && !tells; k++)
      tells = memmem(s, l, telling[k], strlen(telling[k])) != NULL;
    for (int j = 0; j < nl && tells; j++)
      if (lens[j] == l && !memcmp(lines[j], s, l)) tells = 0;
    /* pmap-train's word that the run cannot start as given: the decision's, not a reason. */
    if (l >= 25 && !memcmp(s, "pmap-train: exit status 2", 25)) tells = 0;
    if (train_note(s, l)) tells = 0;
    if (!tells) continue;
    if (memmem(s, l, "signal", 6)) *any_signal = 1;
    lines[nl] = s;
    lens[nl++] = l;
  }
  return nl;
}

int launch_reported(const char *err, size_t n) {
  for (const char *p = err, *end = err + n; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *e = nl ? nl : end;
    while (p < e && (*p == ' ' || *p == '\t')) p++;
    if (e - p >= 12 && !memcmp(p, "pmap-train: ", 12) && !train_note(p, (size_t)(e - p))) return 1;
    p = nl ? nl + 1 : end;
  }
  return 0;
}

int launch_signal_of(const char *err, size_t n, int st) {
  if (WIFSIGNALED(st)) return WTERMSIG(st);
  const char *lines[SEEN_LINES];
  size_t lens[SEEN_LINES];
  int any_signal = 0;
  telling_lines(err, n, lines, lens, &any_signal);
  if (WIFEXITED(st) && WEXITSTATUS(st) > 128 && WEXITSTATUS(st) < 128 + 65 && any_signal)
    return WEXITSTATUS(st) - 128;
  return 0;
}

/* Signals sent to a process from outside it (a preemption, the out-of-memory killer, a person,
 * a batch system's limit), after which a restart may well succeed; the rest (a crash: SIGSEGV,
 * SIGBUS, SIGILL, SIGFPE, SIGABRT, ...) would come again at the start. */
static int from_outside(int sig) {
  return sig == SIGKILL || sig == SIGTERM || sig == SIGHUP || sig == SIGINT || sig == SIGQUIT;
}

int launch_outside_signal(const char *err, size_t n, int st) {
  int sig = launch_signal_of(err, n, st);
  /* Open MPI does not always print its line on a process killed (its status still says it). */
  if (!sig && WIFEXITED(st) && WEXITSTATUS(st) > 128) sig = WEXITSTATUS(st) - 128;
  return from_outside(sig) ? sig : 0;
}

void launch_why_failed(const char *err, size_t n, int st, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  int joined = 0;
  if (WIFSIGNALED(st))
    len += (size_t)snprintf(buf, size, "mpirun itself ended by signal %d (%s)", WTERMSIG(st),
                            strsignal(WTERMSIG(st)));
  const char *lines[SEEN_LINES];
  size_t lens[SEEN_LINES];
  int any_signal = 0, nl = telling_lines(err, n, lines, lens, &any_signal);
  int sig = launch_signal_of(err, n, st);
  if (sig && !WIFSIGNALED(st))
    len += (size_t)snprintf(buf + len, size - len, "a process ended by signal %d", sig);
  joined = len > 0;
  /* The failing process's own message first, then mpirun's lines, then the messages of the
   * processes that failed only because it ended (those reach mpirun in no fixed order). */
  int shown = 0;
  for (int pass = 0; pass < 3; pass++)
    for (int j = 0; j < nl && shown < WHY_LINES && len + 3 < size; j++) {
      int own = (lens[j] >= 12 && !memcmp(lines[j], "pmap-train: ", 12)) ||
                (lens[j] >= 14 && !memcmp(lines[j], "pmap: process ", 14));
      int another = reports_another(lines[j], lens[j]);
      if ((pass == 0 && !(own && !another)) || (pass == 1 && own) || (pass == 2 && !another))
        continue;
      if (joined) len += (size_t)snprintf(buf + len, size - len, "; ");
      joined = 1;
      shown++;
      /* Runs of blanks as one space ("Exit code:    1"), at most 400 characters a line. */
      for (size_t i = 0; i < lens[j] && i < 400 && len + 1 < size; i++)
        if (!(lines[j][i] == ' ' || lines[j][i] == '\t') || buf[len - 1] != ' ')
          buf[len++] = lines[j][i] == '\t' ? ' ' : lines[j][i];
      buf[len] = '\0';
    }
  if (!len) snprintf(buf, size, "no message (see above)");
}

/* The value of "key": "..." in a JSON line, unescaped into buf (0), or -1. */
static int json_text(const char *line, const char *key, char *buf, size_t size) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\": \"", key);
  const char *p = strstr(line, pat);
  if (!p || !size) return -1;
  p += strlen(pat);
  size_t k = 0;
  for (; *p && *p != '"' && k + 1 < size; p++) {
    if (*p == '\\' && p[1]) {
      p++;
      buf[k++] = *p == 'n' || *p == 't' ? ' ' : *p == 'u' ? '?' : *p;
      if (*p == 'u')
        for (int i = 0; i < 4 && p[1]; i++) p++;
      continue;
    }
    buf[k++] = *p;
  }
  buf[k] = '\0';
  return 0;
}

/* The last line of text[0..n), in buf. */
static void last_line(const char *text, size_t n, char *buf, size_t size) {
  while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) n--;
  size_t start = n;
  while (start && text[start - 1] != '\n') start--;
  snprintf(buf, size, "%.*s", (int)(n - start), text + start);
}

/* The step of the checkpoint at path as the program loads it alone (--inspect): >= 0, with
 * *last the run's last step (its --steps; -1 when not said); -1 with why filled; -2 once *stop
 * is set. */
static int64_t check_step(const launch *L, const char *path, volatile sig_atomic_t *stop,
                          int64_t *last, char *why, size_t size) {
  *last = -1;
  size_t n = (size_t)L->nargs + 5;
  char **argv = calloc(n, sizeof *argv);
  char **envp = launch_env("PMAP_DIST=none", 1);
  if (!argv || !envp) {
    free(argv);
    free(envp);
    snprintf(why, size, "out of memory");
    return -1;
  }
  size_t k = 0;
  argv[k++] = L->prog[0];
  for (int i = 0; i < L->nargs; i++) argv[k++] = (char *)L->args[i];
  argv[k++] = "--inspect";
  argv[k++] = (char *)path;
  argv[k++] = "--json";
  proc p = {.out = {.copy_to = -1, .keep_cap = 1 << 16},
            .err = {.copy_to = -1, .keep_cap = 1 << 14}};
  int rc = proc_start(&p, argv, envp, why, size);
  free(argv);
  free(envp);
  if (rc) return -1;
  int w = proc_wait(&p, cli_now() + CHECK_LIMIT_S, stop);
  if (w) proc_stop(&p, 1.0);
  proc_ending e;
  proc_end(&p, 1.0, &e);
  proc_close(&p);
  int64_t step = -1;
  char line[4096];
  last_line(p.out.keep ? p.out.keep : "", p.out.kept, line, sizeof line);
  const char *s = strstr(line, "\"valid\": true, \"step\": ");
  if (w == 2) {
    step = -2;
  } else if (w == 1) {
    snprintf(why, size, "the check did not end within %.0f s", CHECK_LIMIT_S);
  } else if (WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0 && s) {
    step = strtoll(s + strlen("\"valid\": true, \"step\": "), NULL, 10);
    const char *t = strstr(s, "\"steps\": ");
    if (t) *last = strtoll(t + strlen("\"steps\": "), NULL, 10);
  } else if (json_text(line, "error", why, size)) {
    last_line(p.err.keep ? p.err.keep : "", p.err.kept, line, sizeof line);
    if (*line)
      snprintf(why, size, "%.1000s", line);
    else
      snprintf(why, size, "%s --inspect ended with status %d", L->prog[0],
               WIFEXITED(p.status) ? WEXITSTATUS(p.status) : 128 + WTERMSIG(p.status));
  }
  proc_free(&p);
  return step;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The file the saves write for FILE save (malloc'ed, NULL out of memory): save itself, or the
 * file a symbolic link save names, through a chain of links, also where that file does not
 * exist yet (the saves create it there: pmap_params_save's rule). */
static char *saved_file(const char *save) {
  struct stat st;
  if (lstat(save, &st) != 0 || !S_ISLNK(st.st_mode)) return strdup(save);
  char *cur = realpath(save, NULL);
  if (cur) return cur;
  cur = strdup(save);
  for (int i = 0; cur && i < 40; i++) {
    char text[4096];
    ssize_t len = readlink(cur, text, sizeof text - 1);
    if (len < 0) break; /* not a link: the end of the chain */
    text[len] = '\0';
    const char *slash = strrchr(cur, '/');
    int dir = text[0] == '/' || !slash ? 0 : (int)(slash - cur) + 1;
    size_t size = (size_t)dir + (size_t)len + 1;
    char *next = malloc(size);
    if (next) snprintf(next, size, "%.*s%s", dir, cur, text);
    free(cur);
    cur = next;
  }
  return cur;
}

/* FILE, then FILE.tmp.* in name order (beside the file a symbolic link FILE names: the saves
 * write there); *base: that file's path (malloc'ed). Returns the count, -1 out of memory. */
static int candidates(const char *save, char ***out, char **base) {
  *out = NULL;
  *base = saved_file(save);
  char **v = calloc(1, sizeof *v);
  if (!*base || !v || !(v[0] = strdup(save))) {
    free(v);
    return -1;
  }
  int n = 1, cap = 1;
  const char *slash = strrchr(*base, '/');
  size_t dirlen = slash ? (size_t)(slash - *base) + 1 : 0; /* with its '/' */
  char *dir = slash ? strndup(*base, dirlen) : strdup(".");
  char prefix[4096];
  snprintf(prefix, sizeof prefix, "%s.tmp.", *base + dirlen);
  size_t plen = strlen(prefix);
  DIR *d = dir ? opendir(dir) : NULL;
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (strncmp(de->d_name, prefix, plen) || !de->d_name[plen]) continue;
    if (n == cap) {
      char **nv = realloc(v, (size_t)(cap *= 2) * sizeof *nv);
      if (!nv) break;
      v = nv;
    }
    size_t len = dirlen + strlen(de->d_name) + 1;
    if (!(v[n] = malloc(len))) break;
    snprintf(v[n++], len, "%.*s%s", (int)dirlen, *base, de->d_name);
  }
  if (d) closedir(d);
  free(dir);
  qsort(v + 1, (size_t)(n - 1), sizeof *v, by_name);
  *out = v;
  return n;
}

/* Makes a rename durable: fsync of the folder of path. */
static void sync_folder(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, (size_t)(slash - path) + 1) : strdup(".");
  int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  free(dir);
}

int launch_newest(const launch *L, launch_say say, volatile sig_atomic_t *stop, int64_t *step,
                  int64_t *last, char **path) {
  char **c = NULL, *base = NULL, why[2048];
  int n = candidates(L->save, &c, &base), best = -1, rc = 0;
  *path = NULL;
  *step = -1;
  *last = -1;
  for (int i = 0; i < n; i++) {
    struct stat st;
    if (stat(c[i], &st)) continue; /* none yet, or gone */
    if (!S_ISREG(st.st_mode)) {
      say(L, "checkpoint %s is not a regular file; skipped", c[i]);
      continue;
    }
    int64_t total = -1, s = check_step(L, c[i], stop, &total, why, sizeof why);
    if (s == -2) {
      rc = -1;
      break;
    }
    if (s < 0)
      say(L, "checkpoint %s does not load; skipped: %s", c[i], why);
    else if (s > *step)
      *step = s, *last = total, best = i;
  }
  if (!rc && best > 0) {
    /* The newest is a save killed between writing and renaming: finish that save. */
    if (rename(c[best], base) == 0) {
      sync_folder(base);
      say(L, "checkpoint %s (step %lld) is a save cut short before its rename: renamed to %s",
          c[best], (long long)*step, base);
      *path = strdup(L->save);
    } else {
      say(L, "checkpoint %s (step %lld) cannot be renamed to %s (%s): resuming from it as it is",
          c[best], (long long)*step, base, strerror(errno));
      *path = strdup(c[best]);
    }
  } else if (!rc && best == 0) {
    *path = strdup(c[0]);
  }
  for (int i = 0; i < n; i++) free(c[i]);
  free(c);
  free(base);
  return rc;
}
