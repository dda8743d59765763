/* cli.c: strict argument parsing for the command-line programs. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char last_error[1024];

const char *cli_last_error(void) { return last_error; }

int cli_error(const char *prog, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s\n", prog, last_error);
  return -1;
}

int cli_has_flag(int argc, char **argv, const char *flag) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], flag)) return 1;
  return 0;
}

int cli_int(const char *prog, const char *opt, const char *s, int64_t lo, int64_t hi,
            int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    cli_error(prog, "%s \"%s\" is not an integer in [%lld, %lld]", opt, s, (long long)lo,
              (long long)hi);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_u64(const char *prog, const char *opt, const char *s, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-') {
    cli_error(prog, "%s \"%s\" is not a non-negative integer", opt, s);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_float(const char *prog, const char *opt, const char *s, float *out) {
  char *end = NULL;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end) {
    cli_error(prog, "%s \"%s\" is not a number", opt, s);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_timeout(const char *prog, const char *opt, const char *s, double *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || *end || !(v > 0.0)) {
    cli_error(prog, "%s \"%s\" is not a number of seconds > 0 (inf: never)", opt, s);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_int_list(const char *prog, const char *opt, const char *s, int64_t lo, int64_t hi,
                 int64_t *out, int *count) {
  int n = 0;
  const char *p = s;
  for (;;) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || end == p || (*end && *end != ',') || v < lo || v > hi || n == CLI_MAX_LIST) {
      cli_error(prog, "%s \"%s\" is not a list of at most %d integers in [%lld, %lld]", opt, s,
                CLI_MAX_LIST, (long long)lo, (long long)hi);
      return -1;
    }
    out[n++] = v;
    if (!*end) break;
    p = end + 1;
  }
  *count = n;
  return 0;
}

const char *cli_value(const char *prog, int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    cli_error(prog, "option %s needs a value", argv[*i]);
    return NULL;
  }
  return argv[++*i];
}

int cli_is_option(const char *a, const char *const *names) {
  for (; *names; names++)
    if (!strcmp(a, *names)) return 1;
  return 0;
}

int cli_next(const char *prog, int argc, char **argv, int *i, const char *const *flags,
             const char *const *value_opts, const char **value) {
  const char *a = argv[*i];
  if (!strcmp(a, "--help") || !strcmp(a, "-h")) return CLI_HELP;
  if (cli_is_option(a, flags)) return CLI_FLAG;
  if (!cli_is_option(a, value_opts)) {
    cli_error(prog, "unknown option %s (see --help)", a);
    return CLI_ERROR;
  }
  *value = cli_value(prog, argc, argv, i);
  return *value ? CLI_VALUE : CLI_ERROR;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
