/* cli.c: the option reader of cli.h: strict values, one message per kind of mistake, and the
 * --help text made from the same table. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HELP_WIDTH 100 /* columns of the --help text */
#define HELP_COLUMN 26 /* where an option's help starts, at most */

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

const char *cli_lib_reason(const char *m) {
  size_t n = strspn(m, "abcdefghijklmnopqrstuvwxyz_0123456789");
  return strncmp(m, "pmap_", 5) == 0 && m[n] == ':' && m[n + 1] == ' ' ? m + n + 2 : m;
}

int cli_has_flag(int argc, char **argv, const char *flag) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], flag)) return 1;
  return 0;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- values ---- */

static int read_int(const char *prog, const cli_option *o, const char *s) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < o->lo || v > o->hi)
    return cli_error(prog, "%s \"%s\" is not an integer in [%lld, %lld]", o->name, s,
                     (long long)o->lo, (long long)o->hi);
  *(int64_t *)o->dest = v;
  return 0;
}

static int read_u64(const char *prog, const cli_option *o, const char *s) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || *s == '-')
    return cli_error(prog, "%s \"%s\" is not a non-negative integer", o->name, s);
  *(uint64_t *)o->dest = v;
  return 0;
}

static int read_float(const char *prog, const cli_option *o, const char *s) {
  char *end = NULL;
  errno = 0;
  float v = strtof(s, &end);
  if (errno || end == s || *end) return cli_error(prog, "%s \"%s\" is not a number", o->name, s);
  *(float *)o->dest = v;
  return 0;
}

static int read_real(const char *prog, const cli_option *o, const char *s) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end) return cli_error(prog, "%s \"%s\" is not a number", o->name, s);
  *(double *)o->dest = v;
  return 0;
}

static int read_seconds(const char *prog, const cli_option *o, const char *s) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || *end || !(v > 0.0))
    return cli_error(prog, "%s \"%s\" is not a number of seconds > 0 (inf: never)", o->name, s);
  *(double *)o->dest = v;
  return 0;
}

static int read_list(const char *prog, const cli_option *o, const char *s) {
  int64_t *out = o->dest;
  int n = 0;
  const char *p = s;
  for (;;) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || end == p || (*end && *end != ',') || v < o->lo || v > o->hi || n == CLI_MAX_LIST)
      return cli_error(prog, "%s \"%s\" is not a list of at most %d integers in [%lld, %lld]",
                       o->name, s, CLI_MAX_LIST, (long long)o->lo, (long long)o->hi);
    out[n++] = v;
    if (!*end) break;
    p = end + 1;
  }
  *o->count = n;
  return 0;
}

/* "a, b or c" of the choices into buf. */
static void choice_list(const char *const *c, const char *last_sep, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; c[i] && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%s",
                            i == 0     ? ""
                            : c[i + 1] ? ", "
                                       : last_sep,
                            c[i]);
}

static int read_choice(const char *prog, const cli_option *o, const char *s) {
  for (int i = 0; o->choices[i]; i++)
    if (!strcmp(s, o->choices[i])) {
      *(int *)o->dest = i;
      return 0;
    }
  char names[256];
  choice_list(o->choices, " or ", names, sizeof names);
  return cli_error(prog, "%s \"%s\" is not %s", o->name, s, names);
}

/* "4G", "128M", "8" for bytes. */
static void size_text(int64_t v, char *buf, size_t size) {
  static const char units[] = "GMK";
  for (int u = 0; u < 3; u++) {
    int64_t m = INT64_C(1) << (10 * (3 - u));
    if (v && v % m == 0) {
      snprintf(buf, size, "%lld%c", (long long)(v / m), units[u]);
      return;
    }
  }
  snprintf(buf, size, "%lld", (long long)v);
}

/* Whether s is decimal digits, or digits with a fraction (".5", a digit at least) and then one
 * K, M or G, any case, or digits and a unit: nothing else (no space, sign, exponent, hex, inf or
 * nan, which strtod would read; no "1." and no fraction of a byte, "1.5"). */
static int bytes_form(const char *s) {
  const char *p = s, *point = NULL;
  while (*p >= '0' && *p <= '9') p++;
  if (p == s) return 0;
  if (*p == '.') {
    point = ++p;
    while (*p >= '0' && *p <= '9') p++;
    if (p == point) return 0;
  }
  if (*p && strchr("KkMmGg", *p))
    p++;
  else if (point)
    return 0;
  return *p == '\0';
}

/* What is wrong with a fraction in s, for the message ("" when none is). */
static const char *fraction_hint(const char *s) {
  const char *point = strchr(s, '.');
  if (!point) return "";
  if (!(point[1] >= '0' && point[1] <= '9')) return "; a fraction needs digits after the point";
  if (!strpbrk(s, "KkMmGg")) return "; a fraction needs K, M or G after it (1.5K is 1536 bytes)";
  return "";
}

static int read_bytes(const char *prog, const cli_option *o, const char *s) {
  char *end = NULL;
  /* A plain count of bytes is read exactly; "1.5G" and the like through a double. */
  errno = 0;
  long long exact = strtoll(s, &end, 10);
  if (end != s && !*end && errno == 0 && *s != ' ' && *s != '+') {
    if (exact < o->lo || exact > o->hi) end = NULL;
    if (end) {
      *(int64_t *)o->dest = (int64_t)exact;
      return 0;
    }
  }
  end = NULL;
  double v = strtod(s, &end), mult = 1.0;
  if (end && *end && !end[1]) {
    if (*end == 'K' || *end == 'k')
      mult = 1024.0;
    else if (*end == 'M' || *end == 'm')
      mult = 1048576.0;
    else if (*end == 'G' || *end == 'g')
      mult = 1073741824.0;
    else
      end = NULL;
    if (end) end++;
  }
  /* 2^63 is where int64_t ends: (double)INT64_MAX rounds up to it. */
  if (!bytes_form(s) || !end || end == s || *end || !(v * mult >= (double)o->lo) ||
      v * mult > (double)o->hi || v * mult >= 9223372036854775808.0) {
    char lo[32], hi[32];
    size_text(o->lo, lo, sizeof lo);
    size_text(o->hi, hi, sizeof hi);
    return cli_error(prog,
                     "%s \"%s\" is not a size in bytes from %s to %s (decimal digits, with an "
                     "optional fraction and K, M or G: powers of 1024)%s",
                     o->name, s, lo, hi, fraction_hint(s));
  }
  *(int64_t *)o->dest = (int64_t)(v * mult);
  return 0;
}

static int read_value(const char *prog, const cli_option *o, const char *s) {
  switch (o->kind) {
  case CLI_FLAG: return 0;
  case CLI_INT: return read_int(prog, o, s);
  case CLI_U64: return read_u64(prog, o, s);
  case CLI_FLOAT: return read_float(prog, o, s);
  case CLI_REAL: return read_real(prog, o, s);
  case CLI_SECONDS: return read_seconds(prog, o, s);
  case CLI_STRING: *(const char **)o->dest = s; return 0;
  case CLI_LIST: return read_list(prog, o, s);
  case CLI_CHOICE: return read_choice(prog, o, s);
  case CLI_BYTES: return read_bytes(prog, o, s);
  }
  return cli_error(prog, "%s: unknown kind of option %d", o->name, (int)o->kind);
}

int cli_parse(const cli_spec *spec, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      cli_help(spec, stdout);
      return 1;
    }
    const cli_option *o = NULL;
    for (int k = 0; k < spec->count && !o; k++)
      if (!strcmp(a, spec->options[k].name)) o = &spec->options[k];
    if (!o) return cli_error(spec->prog, "unknown option %s (see --help)", a);
    if (o->given) *o->given = 1;
    if (o->kind == CLI_FLAG) {
      *(int *)o->dest = o->flag;
    } else {
      if (i + 1 >= argc) return cli_error(spec->prog, "option %s needs a value", a);
      if (read_value(spec->prog, o, argv[++i])) return -1;
    }
    if (o->check && o->check(spec->prog, o, o->kind == CLI_FLAG ? NULL : argv[i])) return -1;
  }
  return 0;
}

/* ---- help ---- */

/* "--model NAME", "--backend auto|cpu|cuda", "--json" into buf. */
static void label(const cli_option *o, char *buf, size_t size) {
  size_t len = (size_t)snprintf(buf, size, "%s", o->name);
  if (o->kind == CLI_FLAG || len >= size) return;
  if (o->arg || o->kind != CLI_CHOICE) {
    snprintf(buf + len, size - len, " %s", o->arg ? o->arg : "VALUE");
    return;
  }
  for (int i = 0; o->choices[i] && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%s", i ? "|" : " ", o->choices[i]);
}

/* Prints text word by word from column `at` (the cursor is there), wrapping to HELP_WIDTH with
 * continuation lines indented to `indent`; a newline in text starts a new line. */
static void wrap(FILE *f, const char *text, int at, int indent) {
  int col = at;
  for (const char *p = text; *p;) {
    if (*p == '\n') {
      fprintf(f, "\n%*s", indent, "");
      col = indent;
      p++;
      continue;
    }
    if (*p == ' ') {
      p++;
      continue;
    }
    int len = (int)strcspn(p, " \n");
    if (col > indent && col + 1 + len > HELP_WIDTH) {
      fprintf(f, "\n%*s", indent, "");
      col = indent;
    } else if (col > indent) {
      fputc(' ', f);
      col++;
    }
    fprintf(f, "%.*s", len, p);
    col += len;
    p += len;
  }
}

void cli_help(const cli_spec *spec, FILE *f) {
  char buf[160], words[4096];
  size_t len = 0;
  words[0] = '\0';
  for (int k = 0; k < spec->count && len < sizeof words; k++) {
    label(&spec->options[k], buf, sizeof buf);
    /* Non-breaking inside an option: its brackets and value stay on one line. */
    for (char *c = buf; *c; c++)
      if (*c == ' ') *c = '\x1f';
    len += (size_t)snprintf(words + len, sizeof words - len, "%s[%s]", k ? " " : "", buf);
  }
  int head = fprintf(f, "usage: %s ", spec->prog);
  char *p = words;
  int col = head;
  /* The synopsis, wrapped with its lines indented under the first option. */
  while (*p) {
    int n = (int)strcspn(p, " ");
    if (col > head && col + 1 + n > HELP_WIDTH) {
      fprintf(f, "\n%*s", head, "");
      col = head;
    } else if (col > head) {
      fputc(' ', f);
      col++;
    }
    for (int i = 0; i < n; i++) fputc(p[i] == '\x1f' ? ' ' : p[i], f);
    col += n;
    p += n;
    if (*p) p++;
  }
  fputc('\n', f);
  if (spec->about) {
    wrap(f, spec->about, 0, 0);
    fputc('\n', f);
  }
  int column = 0;
  for (int k = 0; k < spec->count; k++) {
    label(&spec->options[k], buf, sizeof buf);
    int w = 2 + (int)strlen(buf) + 2;
    if (w > column && w <= HELP_COLUMN) column = w;
  }
  for (int k = 0; k < spec->count; k++) {
    label(&spec->options[k], buf, sizeof buf);
    int at = fprintf(f, "  %s", buf);
    if (at + 2 > column) {
      fprintf(f, "\n%*s", column, "");
    } else {
      fprintf(f, "%*s", column - at, "");
    }
    wrap(f, spec->options[k].help ? spec->options[k].help : "", column, column);
    fputc('\n', f);
  }
  if (spec->notes) {
    wrap(f, spec->notes, 0, 0);
    fputc('\n', f);
  }
}
