/* cli.h: argument parsing shared by the command-line programs: strict numbers and lists, and
 * the one way they report errors (a message on stderr, exit status 1). */
#ifndef PMAP_TOOLS_CLI_H
#define PMAP_TOOLS_CLI_H

#include <stdint.h>

#define CLI_MAX_LIST 16

/* Prints "<prog>: <message>" on stderr, keeps the message for cli_last_error, returns -1. Every
 * parse error of these functions goes through it. */
int cli_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the last cli_error ("" before any). */
const char *cli_last_error(void);
/* Whether flag is one of argv[1..argc): to know, before parsing succeeds, that it was given. */
int cli_has_flag(int argc, char **argv, const char *flag);

/* Each returns 0 on success, else prints "<prog>: <what>" on stderr and returns -1. */
int cli_int(const char *prog, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_float(const char *prog, const char *opt, const char *s, float *out);
int cli_u64(const char *prog, const char *opt, const char *s, uint64_t *out);
/* Seconds of a timeout: a number > 0, or inf (never); HUGE_VAL for inf. */
int cli_timeout(const char *prog, const char *opt, const char *s, double *out);
/* A comma-separated list of integers in [lo, hi], e.g. "1,2,4". */
int cli_int_list(const char *prog, const char *opt, const char *s, int64_t lo, int64_t hi,
                 int64_t *out, int *count);
/* The value of option argv[*i] (advancing *i), or NULL with a message when it is missing. */
const char *cli_value(const char *prog, int argc, char **argv, int *i);
/* Whether a is one of the NULL-terminated names. */
int cli_is_option(const char *a, const char *const *names);

enum { CLI_ERROR = -1, CLI_FLAG = 0, CLI_VALUE = 1, CLI_HELP = 2 };
/* Classifies argv[*i]: CLI_HELP for --help or -h; CLI_FLAG when it is one of flags; CLI_VALUE
 * when it is one of value_opts, with *value its value (*i advanced past it); else CLI_ERROR
 * after printing why (an unknown option or a missing value). Both lists end with NULL. */
int cli_next(const char *prog, int argc, char **argv, int *i, const char *const *flags,
             const char *const *value_opts, const char **value);
double cli_now(void); /* seconds, monotonic */

#endif
