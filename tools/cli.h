/* cli.h: the one reader of command-line options of pmap's programs (pmap-train, pmap-bench,
 * pmap-allreduce, pmap-step, pmap-launch). Each program describes its options in a table (name,
 * kind, range, where the value goes, help); cli_parse reads argv against it strictly and cli_help
 * prints the --help text made from it. Every error is "<prog>: <message>" on stderr, exit status
 * 1 (pmap-launch's is 2: a status of 1 can be its job's). */
#ifndef PMAP_TOOLS_CLI_H
#define PMAP_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#define CLI_MAX_LIST 16

/* What an option takes, and where it puts it (cli_option.dest). */
typedef enum cli_kind {
  CLI_FLAG,    /* no value: int = .flag */
  CLI_INT,     /* int64_t, a decimal integer in [lo, hi] */
  CLI_U64,     /* uint64_t, a non-negative decimal integer */
  CLI_FLOAT,   /* float, any number strtof reads (nan and inf included: .check limits it) */
  CLI_REAL,    /* double, any number strtod reads (nan and inf included: .check limits it) */
  CLI_SECONDS, /* double, seconds > 0; inf: never */
  CLI_STRING,  /* const char *, the value as given */
  CLI_LIST,    /* int64_t[CLI_MAX_LIST], comma-separated integers in [lo, hi]; *count of them */
  CLI_CHOICE,  /* int, the index of the value among .choices */
  CLI_BYTES,   /* int64_t, bytes in [lo, hi]: decimal digits with an optional K, M or G (any
                  case; powers of 1024), or digits with a fraction (a digit after the point)
                  and one of them, e.g. 8, 1.5M, 4g; 1.5 and 1.K are refused; a fraction of a
                  byte is dropped (1.0001K is 1025) */
} cli_kind;

typedef struct cli_option cli_option;
struct cli_option {
  const char *name; /* "--steps", "-b" */
  cli_kind kind;
  void *dest;                 /* where the value goes, of the kind's type */
  const char *arg;            /* the value's name in the help ("N", "FILE"); CLI_CHOICE: NULL shows
                        the choices (a|b|c) */
  const char *help;           /* what it does, its default; wrapped to 100 columns */
  int64_t lo, hi;             /* CLI_INT, CLI_LIST, CLI_BYTES: the range */
  int *count;                 /* CLI_LIST: how many integers were given */
  const char *const *choices; /* CLI_CHOICE: the names, NULL-terminated */
  int flag;                   /* CLI_FLAG: the value dest takes */
  int *given;                 /* set to 1 when the option is given (optional) */
  /* A check or conversion of the program's own after the kind's (optional): 0, or -1 after
   * cli_error. For values whose rule is not a range, e.g. a float in [0, 1). */
  int (*check)(const char *prog, const cli_option *o, const char *value);
};

/* A program's options and the text of its --help around them. */
typedef struct cli_spec {
  const char *prog;
  const cli_option *options;
  int count;
  const char *about; /* printed after the usage line (optional) */
  const char *notes; /* printed after the options (optional) */
} cli_spec;

/* Reads argv[1..argc) against spec's table, in order: each option's value converted and checked
 * into its dest. Returns 0; 1 after printing the help on stdout for --help or -h; -1 at the
 * first error ("unknown option --x (see --help)", "option --steps needs a value", or the
 * value's), printed by cli_error. A value is always the next argument, even one that starts
 * with "-". */
int cli_parse(const cli_spec *spec, int argc, char **argv);
/* The --help text: "usage: <prog> [--opt ARG] ...", about, one entry per option, notes. */
void cli_help(const cli_spec *spec, FILE *f);

/* Prints "<prog>: <message>" on stderr, keeps the message for cli_last_error, returns -1. Every
 * error of cli_parse goes through it, and so should a program's own checks of its options. */
int cli_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the last cli_error ("" before any). */
const char *cli_last_error(void);
/* A message of the library (pmap_last_error()) without the call it names first ("pmap_x: "),
 * where a program names the option the value came from instead: "--backend: unknown backend". */
const char *cli_lib_reason(const char *msg);
/* Whether flag is one of argv[1..argc): to know, before parsing succeeds, that it was given. */
int cli_has_flag(int argc, char **argv, const char *flag);

double cli_now(void); /* seconds, monotonic */

#endif
