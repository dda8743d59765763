/* child_run.h: a test that runs itself again as a child process, in a mode of its own, with
 * settings of the environment that it must not share with the parent (the GEMM and convolution
 * choices are made once per process): test_gemm_choice.c, test_conv_choice.c. */
#ifndef PMAP_TESTS_CHILD_RUN_H
#define PMAP_TESTS_CHILD_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* Runs this program (/proc/self/exe, named `name`) as `name child MODE`, with XDG_CACHE_HOME set
 * to cache, the variables of `unset` (NULL-terminated) removed and then those of env ("NAME=VALUE",
 * NULL-terminated) set; its standard output into out (cap bytes, terminated). A child that does
 * not exit with status 0 is a failure. */
static inline void child_run(const char *name, const char *mode, const char *cache,
                             const char *const *unset, const char *const *env, char *out,
                             size_t cap) {
  out[0] = '\0';
  int fd[2];
  if (pipe(fd)) exit(2);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    for (int i = 0; unset && unset[i]; i++) unsetenv(unset[i]);
    setenv("XDG_CACHE_HOME", cache, 1);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    execl("/proc/self/exe", name, "child", mode, (char *)NULL);
    _exit(3);
  }
  close(fd[1]);
  size_t len = 0;
  ssize_t got;
  while (len < cap - 1 && (got = read(fd[0], out + len, cap - 1 - len)) > 0) len += (size_t)got;
  out[len] = '\0';
  close(fd[0]);
  int ws = 0;
  waitpid(pid, &ws, 0);
  CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "%s: child %s exited with wait status %d: %s", name,
        mode, ws, out);
}

#endif
