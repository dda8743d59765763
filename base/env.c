/* env.c: the environment reader of env.h. */
#include "env.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

const char *pmap_env_get(const char *name) {
  const char *s = getenv(name);
  return s && *s ? s : NULL;
}

pmap_status pmap_env_long(const char *name, long lo, long hi, long dflt, long *out) {
  const char *s = pmap_env_get(name);
  *out = dflt;
  if (!s) return PMAP_SUCCESS;
  char *end = NULL;
  errno = 0;
  /* Decimal digits, a minus sign first at most: no spaces or plus sign, at either end. */
  int digits = (*s >= '0' && *s <= '9') || (*s == '-' && s[1] >= '0' && s[1] <= '9');
  long v = digits ? strtol(s, &end, 10) : 0;
  if (!digits || errno || end == s || *end || v < lo || v > hi)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable %s=\"%s\" is not an integer in [%ld, %ld]", name, s, lo,
                    hi);
  *out = v;
  return PMAP_SUCCESS;
}

pmap_status pmap_env_flag(const char *name, int dflt, int *out) {
  const char *s = pmap_env_get(name);
  *out = dflt;
  if (!s) return PMAP_SUCCESS;
  if (strcmp(s, "0") && strcmp(s, "1"))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "environment variable %s=\"%s\" is neither 0 nor 1",
                    name, s);
  *out = s[0] == '1';
  return PMAP_SUCCESS;
}

pmap_status pmap_env_choice(const char *name, const char *const *names, int dflt, int *out) {
  const char *s = pmap_env_get(name);
  *out = dflt;
  if (!s) return PMAP_SUCCESS;
  char list[256];
  size_t len = 0;
  list[0] = '\0';
  for (int i = 0; names[i]; i++) {
    if (!strcmp(s, names[i])) {
      *out = i;
      return PMAP_SUCCESS;
    }
    if (len < sizeof list)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", names[i]);
  }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "environment variable %s=\"%s\" is none of %s", name,
                  s, list);
}

pmap_status pmap_env_seconds(const char *name, double dflt, double *out) {
  const char *s = pmap_env_get(name);
  *out = dflt;
  if (!s) return PMAP_SUCCESS;
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno == ERANGE && isinf(v)) errno = 0;
  if (errno || end == s || *end || isnan(v) || v == 0.0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "environment variable %s=\"%s\" is not a number of seconds > 0 (inf or a "
                    "negative number: never time out)",
                    name, s);
  *out = v;
  return PMAP_SUCCESS;
}
