/* env.h: the one reader of pmap's environment variables. Unset and empty are the same: the
 * default. A value that is set but wrong is PMAP_ERR_INVALID_ARGUMENT naming the variable, its
 * text and what it may be ("environment variable PMAP_CPU_DEVICES="abc" is not an integer in
 * [1, 64]"), never silently the default. */
#ifndef PMAP_BASE_ENV_H
#define PMAP_BASE_ENV_H

#include "pmap.h"

/* The variable's text, NULL when unset or empty. */
const char *pmap_env_get(const char *name);
/* A decimal integer in [lo, hi]; dflt when unset. */
pmap_status pmap_env_long(const char *name, long lo, long hi, long dflt, long *out);
/* "0" or "1"; dflt when unset. */
pmap_status pmap_env_flag(const char *name, int dflt, int *out);
/* One of the NULL-terminated names: its index into *out; dflt when unset. */
pmap_status pmap_env_choice(const char *name, const char *const *names, int dflt, int *out);
/* A number of seconds > 0, or inf or a negative number (returned as they are: "never");
 * dflt when unset. */
pmap_status pmap_env_seconds(const char *name, double dflt, double *out);

#endif
