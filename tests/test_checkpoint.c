/* test_checkpoint.c: pmap_params_save / pmap_params_load: round trips on 1, 2 and 3 devices,
 * byte-identical saves, and every kind of bad file (a bit flip anywhere, a truncation at every
 * length, another version, magic, model or optimizer, a user buffer too small, NULLs, unwritable
 * paths, a folder or FIFO never replaced, a link written through, also to a file not there yet,
 * a link into a missing folder or a loop refused) rejected with its own message and the training
 * state left bitwise unchanged; pmap_params_save_check under the same rules, leaving nothing;
 * every kind of layer recorded with the format's code and geometry. */
#include <dirent.h>
#include <sys/stat.h>

#include "ckpt_util.h"

static char dir[256], path_a[300], path_b[300], scratch[300], bad[300];

/* Bitwise CRC-32C, independent of the library's table-driven one. */
static uint32_t crc32c_ref(uint32_t crc, const unsigned char *p, size_t n) {
  crc = ~crc;
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

static uint32_t rd32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Offsets of the five sections' headers, walking the file as the format describes it. */
static int sections(const unsigned char *f, size_t n, size_t at[5]) {
  size_t o = 32;
  for (int i = 0; i < 5; i++) {
    if (o + 16 > n) return -1;
    at[i] = o;
    o += 16 + (size_t)rd64(f + o + 8);
  }
  return o == n ? 0 : -1;
}

static void fix_header_crc(unsigned char *f) { wr32(f + 28, crc32c_ref(0, f, 28)); }
static void fix_section_crc(unsigned char *f, size_t at) {
  uint32_t c = crc32c_ref(0, f + at, 4);
  wr32(f + at + 4, crc32c_ref(c, f + at + 8, 8 + (size_t)rd64(f + at + 8)));
}

/* Writes buf to `bad`, loads it into s, and requires `want` with needle in the message and the
 * state unchanged (the full snapshot when full, else the replicas and the step only). */
static void expect_rejected(state *s, const unsigned char *buf, size_t n, pmap_status want,
                            const char *needle, const char *what, int full) {
  snapshot before = {0}, after = {0};
  if (full) snapshot_take(s, scratch, &before);
  int dn = pmap_ctx_num_devices(s->ctx);
  size_t P = pmap_params_count(s->params);
  float *w0 = malloc((size_t)dn * P * sizeof *w0), *w1 = malloc((size_t)dn * P * sizeof *w1);
  for (int d = 0; d < dn; d++) CHECK_OK(pmap_params_read(s->params, d, w0 + (size_t)d * P, P));
  int64_t step = pmap_params_step(s->params);
  CHECK(file_write(bad, buf, n) == 0, "cannot write %s", bad);
  char user[64];
  size_t got = 12345;
  pmap_status st = pmap_params_load_user(s->params, bad, user, sizeof user, &got);
  CHECK(st == want, "%s: status %s, want %s (%s)", what, pmap_status_string(st),
        pmap_status_string(want), pmap_last_error());
  CHECK(!needle || strstr(pmap_last_error(), needle), "%s: message \"%s\" lacks \"%s\"", what,
        pmap_last_error(), needle);
  CHECK(got == 12345, "%s: user_bytes written on failure", what);
  for (int d = 0; d < dn; d++) CHECK_OK(pmap_params_read(s->params, d, w1 + (size_t)d * P, P));
  CHECK(memcmp(w0, w1, (size_t)dn * P * sizeof *w0) == 0 && step == pmap_params_step(s->params),
        "%s: the replicas or the step changed", what);
  if (full) {
    snapshot_take(s, scratch, &after);
    snapshot_same(what, &before, &after);
  }
  snapshot_free(&before);
  snapshot_free(&after);
  free(w0);
  free(w1);
}

/* Save, load into a fresh state of another seed, and compare on n devices. */
static void round_trip(const char *name, int n, int64_t batch, int64_t rows) {
  state a, b;
  char what[96];
  snprintf(what, sizeof what, "round trip %s on %d devices", name, n);
  if (state_open(&a, name, n, NULL, 3, batch, rows) ||
      state_open(&b, name, n, NULL, 4, batch, rows))
    return;
  state_train(&a, 0, 3, NULL);
  const char user[] = "position 3";
  CHECK_OK(pmap_params_save_user(a.params, path_a, user, sizeof user));
  char got[32] = {0};
  size_t got_n = 0;
  CHECK_OK(pmap_params_load_user(b.params, path_a, got, sizeof got, &got_n));
  CHECK(got_n == sizeof user && !memcmp(got, user, sizeof user), "%s: user section %zu bytes", what,
        got_n);
  snapshot sa = {0}, sb = {0};
  snapshot_take(&a, path_a, &sa);
  snapshot_take(&b, path_b, &sb);
  snapshot_same(what, &sa, &sb);
  /* A second save of the same state: the same bytes. */
  snapshot sa2 = {0};
  snapshot_take(&a, path_b, &sa2);
  CHECK(sa.bytes == sa2.bytes && !memcmp(sa.file, sa2.file, sa.bytes), "%s: two saves differ",
        what);
  /* And both continue identically. */
  float la = 0, lb = 1;
  state_train(&a, 3, 5, &la);
  state_train(&b, 3, 5, &lb);
  CHECK(!memcmp(&la, &lb, sizeof la), "%s: losses after resuming %.9g vs %.9g", what, (double)la,
        (double)lb);
  snapshot_free(&sa);
  snapshot_free(&sb);
  snapshot_free(&sa2);
  state_close(&a);
  state_close(&b);
}

static void corruptions(void) {
  state s, src;
  if (state_open(&src, "mlp", 2, NULL, 5, 64, 256) || state_open(&s, "mlp", 2, NULL, 6, 64, 256))
    return;
  state_train(&src, 0, 2, NULL);
  state_train(&s, 0, 1, NULL);
  const char user[] = "user data";
  CHECK_OK(pmap_params_save_user(src.params, path_a, user, sizeof user));
  size_t n = 0, at[5];
  unsigned char *f = file_read(path_a, &n), *g = malloc(n);
  if (!f || !g || sections(f, n, at)) {
    CHECK(0, "cannot read or walk %s", path_a);
    free(f);
    free(g);
    return;
  }
  /* The file is good: a load succeeds with its user section. */
  char buf[64];
  size_t ub = 0;
  state probe;
  if (!state_open(&probe, "mlp", 3, NULL, 7, 64, 256)) {
    CHECK_OK(pmap_params_load_user(probe.params, path_a, buf, sizeof buf, &ub));
    CHECK(ub == sizeof user, "user bytes %zu", ub);
    state_close(&probe);
  }
  struct {
    size_t off;
    const char *needle, *what;
  } flips[] = {
      {0, "not a pmap checkpoint", "bit flip in the magic"},
      {8, "is checkpoint version", "bit flip in the version"},
      {17, "header checksum", "bit flip in the file length"},
      {29, "header checksum", "bit flip in the header checksum"},
      {at[0], "section 0 is not MODL", "bit flip in a section tag"},
      {at[0] + 16 + 20, "section MODL checksum", "bit flip in the model"},
      {at[1] + 16 + 9, "section OPTM checksum", "bit flip in the optimizer settings"},
      {at[1] + 16 + 33, "section OPTM checksum", "bit flip in the step"},
      {at[2] + 16 + 8 + 4 * 100 + 2, "section PARM checksum", "bit flip in a parameter"},
      {at[2] + 5, "section PARM checksum", "bit flip in a section checksum"},
      {at[3] + 16 + 16 + 4 * 50 + 3, "section OSTA checksum", "bit flip in the optimizer state"},
      {at[4] + 16 + 3, "section USER checksum", "bit flip in the user section"},
      {at[4] + 8, "claims", "bit flip in a section length"},
  };
  for (size_t i = 0; i < sizeof flips / sizeof *flips; i++) {
    memcpy(g, f, n);
    g[flips[i].off] ^= 0x10;
    expect_rejected(&s, g, n, PMAP_ERR_INVALID_ARGUMENT, flips[i].needle, flips[i].what, 1);
  }
  /* Every byte, one bit each: rejected, whatever the message. */
  for (size_t i = 0; i < n; i += (i < 2048 ? 1 : 97)) {
    memcpy(g, f, n);
    g[i] ^= (unsigned char)(1u << (i % 8));
    char what[64];
    snprintf(what, sizeof what, "bit %zu of byte %zu flipped", i % 8, i);
    expect_rejected(&s, g, n, PMAP_ERR_INVALID_ARGUMENT, NULL, what, 0);
  }
  /* Truncations: every length up to 4 KiB, then a stride, and one byte short. */
  for (size_t len = 0; len < n; len += (len < 4096 ? 1 : 331)) {
    char what[64];
    snprintf(what, sizeof what, "truncated to %zu of %zu bytes", len, n);
    expect_rejected(&s, f, len, PMAP_ERR_INVALID_ARGUMENT, "truncated", what, len % 1000 == 7);
  }
  expect_rejected(&s, f, n - 1, PMAP_ERR_INVALID_ARGUMENT, "truncated", "one byte short", 1);
  /* A trailing byte. */
  memcpy(g, f, n);
  unsigned char *longer = malloc(n + 1);
  memcpy(longer, f, n);
  longer[n] = 0;
  expect_rejected(&s, longer, n + 1, PMAP_ERR_INVALID_ARGUMENT, "too long", "a trailing byte", 1);
  free(longer);
  /* Another version with a valid header checksum; another magic. */
  memcpy(g, f, n);
  wr32(g + 8, 3);
  fix_header_crc(g);
  expect_rejected(&s, g, n, PMAP_ERR_INVALID_ARGUMENT, "checkpoint version 3", "version 3", 1);
  /* Version 2 (bf16 training) has a longer optimizer section than this version 1 file. */
  memcpy(g, f, n);
  wr32(g + 8, 2);
  fix_header_crc(g);
  expect_rejected(&s, g, n, PMAP_ERR_INVALID_ARGUMENT, "expected 44 (version 2)", "version 2", 1);
  memcpy(g, f, n);
  memcpy(g, "PMAPCKPX", 8);
  fix_header_crc(g);
  expect_rejected(&s, g, n, PMAP_ERR_INVALID_ARGUMENT, "not a pmap checkpoint", "wrong magic", 1);
  /* A consistently re-checksummed step of 2^63: out of range. */
  memcpy(g, f, n);
  wr32(g + at[1] + 16 + 32, 0);
  wr32(g + at[1] + 16 + 36, 0x80000000u);
  fix_section_crc(g, at[1]);
  expect_rejected(&s, g, n, PMAP_ERR_INVALID_ARGUMENT, "out of range", "step 2^63", 1);
  /* The highest count is 2^63 - 2, alike for pmap_update and pmap_params_load: 2^63 - 1 does
   * not load; 2^63 - 3 loads and steps once to 2^63 - 2, whose save loads again; there a step
   * is refused, changing nothing, so a run never saves a count it cannot load. */
  memcpy(g, f, n);
  wr32(g + at[1] + 16 + 32, 0xffffffffu);
  wr32(g + at[1] + 16 + 36, 0x7fffffffu);
  fix_section_crc(g, at[1]);
  expect_rejected(&s, g, n, PMAP_ERR_INVALID_ARGUMENT, "out of range", "step 2^63 - 1", 1);
  wr32(g + at[1] + 16 + 32, 0xfffffffdu);
  fix_section_crc(g, at[1]);
  CHECK(file_write(bad, g, n) == 0, "write");
  CHECK_OK(pmap_params_load(s.params, bad));
  CHECK(pmap_params_step(s.params) == INT64_MAX - 2, "step after load %lld",
        (long long)pmap_params_step(s.params));
  state_train(&s, 0, 1, NULL);
  CHECK(pmap_params_step(s.params) == INT64_MAX - 1, "step %lld",
        (long long)pmap_params_step(s.params));
  CHECK_OK(pmap_params_save(s.params, bad));
  CHECK_OK(pmap_params_load(s.params, bad));
  CHECK(pmap_params_step(s.params) == INT64_MAX - 1, "step after the last save's load %lld",
        (long long)pmap_params_step(s.params));
  {
    snapshot last = {0}, again = {0};
    snapshot_take(&s, scratch, &last);
    pmap_array xb = s.xs, yb = s.ys;
    xb.shape[0] = yb.shape[0] = s.batch;
    CHECK_FAILS(pmap_update(s.params, &xb, &yb, NULL), PMAP_ERR_INVALID_ARGUMENT, "cannot grow");
    snapshot_take(&s, scratch, &again);
    snapshot_same("a refused step at the last count", &last, &again);
    snapshot_free(&last);
    snapshot_free(&again);
  }
  /* A re-checksummed learning rate loads: settings come from params, and the test's CRC agrees
   * with the library's. */
  memcpy(g, f, n);
  wr32(g + at[1] + 16 + 8, 0x3f800000u);
  fix_section_crc(g, at[1]);
  CHECK(file_write(bad, g, n) == 0, "write");
  CHECK_OK(pmap_params_load(s.params, bad));
  CHECK(pmap_params_step(s.params) == 2, "step after load %lld",
        (long long)pmap_params_step(s.params));
  /* The user buffer too small; the plain load ignores the user section. */
  state_train(&s, 2, 3, NULL);
  snapshot before = {0}, after = {0};
  snapshot_take(&s, scratch, &before);
  CHECK_FAILS(pmap_params_load_user(s.params, path_a, buf, 4, &ub), PMAP_ERR_INVALID_ARGUMENT,
              "pmap_params_load_user: \"");
  CHECK(strstr(pmap_last_error(), "user section of 10 bytes; the buffer holds 4") != NULL,
        "message: %s", pmap_last_error());
  CHECK_FAILS(pmap_params_load_user(s.params, path_a, NULL, 4, &ub), PMAP_ERR_INVALID_ARGUMENT,
              "user");
  snapshot_take(&s, scratch, &after);
  snapshot_same("user buffer too small", &before, &after);
  snapshot_free(&before);
  snapshot_free(&after);
  CHECK_OK(pmap_params_load(s.params, path_a));
  free(f);
  free(g);
  state_close(&s);
  state_close(&src);
}

/* Another model, another optimizer kind, another optimizer state layout. */
static void mismatches(void) {
  state mlp, lin, sgd, sgdm, adam;
  pmap_optimizer o_sgd = pmap_sgd(0.01f, 0.0f), o_sgdm = pmap_sgd(0.01f, 0.9f);
  if (state_open(&mlp, "mlp", 2, NULL, 1, 64, 256) ||
      state_open(&lin, "linear", 2, NULL, 1, 64, 128) ||
      state_open(&sgd, "mlp", 1, &o_sgd, 1, 64, 256) ||
      state_open(&sgdm, "mlp", 3, &o_sgdm, 1, 48, 240) ||
      state_open(&adam, "convnet", 2, NULL, 1, 8, 32))
    return;
  CHECK_OK(pmap_params_save(mlp.params, path_a));
  size_t n = 0;
  unsigned char *f = file_read(path_a, &n);
  expect_rejected(&lin, f, n, PMAP_ERR_INVALID_ARGUMENT, "holds another model", "mlp into linear",
                  1);
  expect_rejected(&adam, f, n, PMAP_ERR_INVALID_ARGUMENT, "holds another model", "mlp into convnet",
                  1);
  expect_rejected(&sgd, f, n, PMAP_ERR_INVALID_ARGUMENT,
                  "holds another optimizer: Adam (2 state slots); params use SGD without momentum",
                  "Adam into SGD", 1);
  free(f);
  CHECK_OK(pmap_params_save(sgd.params, path_a));
  f = file_read(path_a, &n);
  expect_rejected(&sgdm, f, n, PMAP_ERR_INVALID_ARGUMENT,
                  "another optimizer: SGD without momentum (0 state slots); params use SGD with "
                  "momentum (1)",
                  "SGD into SGD with momentum", 1);
  expect_rejected(&mlp, f, n, PMAP_ERR_INVALID_ARGUMENT, "another optimizer", "SGD into Adam", 1);
  free(f);
  state_close(&mlp);
  state_close(&lin);
  state_close(&sgd);
  state_close(&sgdm);
  state_close(&adam);
}

static void bad_arguments(void) {
  state s;
  if (state_open(&s, "linear", 2, NULL, 1, 64, 128)) return;
  CHECK_FAILS(pmap_params_save(NULL, path_a), PMAP_ERR_INVALID_ARGUMENT, "params is NULL");
  CHECK_FAILS(pmap_params_save(s.params, NULL), PMAP_ERR_INVALID_ARGUMENT, "path is NULL");
  CHECK_FAILS(pmap_params_save(s.params, ""), PMAP_ERR_INVALID_ARGUMENT, "path is empty");
  CHECK_FAILS(pmap_params_save_user(s.params, path_a, NULL, 3), PMAP_ERR_INVALID_ARGUMENT,
              "pmap_params_save_user: user");
  /* A user size no buffer can have: refused before anything is read from user. */
  CHECK_FAILS(pmap_params_save_user(s.params, path_a, "x", SIZE_MAX), PMAP_ERR_OUT_OF_MEMORY,
              "out of memory");
  CHECK_FAILS(pmap_params_load(NULL, path_a), PMAP_ERR_INVALID_ARGUMENT, "params is NULL");
  CHECK_FAILS(pmap_params_load(s.params, NULL), PMAP_ERR_INVALID_ARGUMENT, "path is NULL");
  CHECK_FAILS(pmap_params_load_user(NULL, path_a, NULL, 0, NULL), PMAP_ERR_INVALID_ARGUMENT,
              "params is NULL");
  char p[600];
  snprintf(p, sizeof p, "%s/no-such-folder/x.ckpt", dir);
  CHECK_FAILS(pmap_params_save(s.params, p), PMAP_ERR_UNAVAILABLE,
              "cannot create a temporary file");
  CHECK_FAILS(pmap_params_load(s.params, p), PMAP_ERR_UNAVAILABLE, "cannot open");
  CHECK_FAILS(pmap_params_load(s.params, dir), PMAP_ERR_INVALID_ARGUMENT, "not a regular file");
  /* A read-only folder (root ignores permissions, so only where the mode has effect). */
  char ro[500];
  snprintf(ro, sizeof ro, "%s/ro", dir);
  mkdir(ro, 0555);
  snprintf(p, sizeof p, "%s/x.ckpt", ro);
  if (access(ro, W_OK) != 0)
    CHECK_FAILS(pmap_params_save(s.params, p), PMAP_ERR_UNAVAILABLE, "Permission denied");
  rmdir(ro);
  /* A path that is a folder or a FIFO: refused, left as it was, no temporary file beside it. */
  char sub[500];
  snprintf(sub, sizeof sub, "%s/sub", dir);
  mkdir(sub, 0755);
  char inner[520];
  snprintf(inner, sizeof inner, "%s/keep", sub);
  file_write(inner, (const unsigned char *)"x", 1);
  CHECK_FAILS(pmap_params_save(s.params, sub), PMAP_ERR_UNAVAILABLE, "not a regular file");
  remove(inner);
  CHECK(rmdir(sub) == 0, "the folder %s holds leftovers", sub);
  char fifo[500];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  struct stat st;
  int made = mkfifo(fifo, 0600) == 0;
  CHECK(made, "mkfifo %s", fifo);
  if (made) {
    CHECK_FAILS(pmap_params_save(s.params, fifo), PMAP_ERR_UNAVAILABLE, "not a regular file");
    CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO %s was replaced", fifo);
    remove(fifo);
  }
  /* Through a symbolic link the file it names is replaced and the link stays; a file replaced
   * keeps its permissions. */
  char target[500], link[500];
  snprintf(target, sizeof target, "%s/target.ckpt", dir);
  snprintf(link, sizeof link, "%s/link.ckpt", dir);
  file_write(target, (const unsigned char *)"old", 3);
  chmod(target, 0600);
  made = symlink("target.ckpt", link) == 0;
  CHECK(made, "symlink %s", link);
  if (made) {
    CHECK_OK(pmap_params_save(s.params, link));
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link %s was replaced", link);
    CHECK(stat(target, &st) == 0 && st.st_size > 3 && (st.st_mode & 0777) == 0600,
          "the target: size %lld, mode %o (want the checkpoint, 0600)", (long long)st.st_size,
          (unsigned)(st.st_mode & 0777));
    CHECK_OK(pmap_params_load(s.params, link));
    remove(link);
    /* A link to a file not there yet (`ln -s /big/disk/run.ckpt run.ckpt` before the first
     * save): the check passes and creates nothing, the save creates the file it names (0644),
     * the link stays. */
    char fresh[600];
    snprintf(fresh, sizeof fresh, "%s/fresh.ckpt", dir);
    CHECK(symlink("fresh.ckpt", link) == 0, "symlink %s", link);
    CHECK_OK(pmap_params_save_check(link));
    CHECK(lstat(fresh, &st) != 0, "the check left %s behind", fresh);
    CHECK_OK(pmap_params_save(s.params, link));
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link %s was replaced", link);
    CHECK(stat(fresh, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0644,
          "the file the link names was not created 0644");
    CHECK_OK(pmap_params_load(s.params, link));
    remove(link);
    remove(fresh);
    /* Through two links, the second relative to its own folder. */
    char sub2[500], mid[520];
    snprintf(sub2, sizeof sub2, "%s/deep", dir);
    snprintf(mid, sizeof mid, "%s/mid.ckpt", sub2);
    mkdir(sub2, 0755);
    CHECK(symlink("deep/mid.ckpt", link) == 0 && symlink("end.ckpt", mid) == 0, "symlinks");
    CHECK_OK(pmap_params_save(s.params, link));
    snprintf(fresh, sizeof fresh, "%s/end.ckpt", sub2);
    CHECK(stat(fresh, &st) == 0 && S_ISREG(st.st_mode), "a chain of links: %s not written", fresh);
    remove(fresh);
    remove(mid);
    rmdir(sub2);
    remove(link);
    /* A link into a folder that does not exist, or a loop: refused by the save and the check
     * alike, the link left. */
    CHECK(symlink("no-such-folder/x.ckpt", link) == 0, "symlink %s", link);
    CHECK_FAILS(pmap_params_save(s.params, link), PMAP_ERR_UNAVAILABLE,
                "(the file the symbolic link");
    CHECK_FAILS(pmap_params_save_check(link), PMAP_ERR_UNAVAILABLE, "(the file the symbolic link");
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the dangling link %s was replaced", link);
    remove(link);
    CHECK(symlink("link.ckpt", link) == 0, "symlink %s", link);
    CHECK_FAILS(pmap_params_save(s.params, link), PMAP_ERR_UNAVAILABLE, "symbolic link");
    CHECK_FAILS(pmap_params_save_check(link), PMAP_ERR_UNAVAILABLE, "symbolic link");
    remove(link);
  }
  remove(target);
  state_close(&s);
}

/* Entries of folder d other than . and .. (-1 when it cannot be read). */
static int entries(const char *d) {
  DIR *f = opendir(d);
  if (!f) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(f));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(f);
  return n;
}

/* pmap_params_save_check: the save's rules, checked before any save, writing nothing. */
static void save_check(void) {
  char d[400], p[500];
  snprintf(d, sizeof d, "%s/check", dir);
  mkdir(d, 0755);
  CHECK_FAILS(pmap_params_save_check(NULL), PMAP_ERR_INVALID_ARGUMENT, "path is NULL");
  CHECK_FAILS(pmap_params_save_check(""), PMAP_ERR_INVALID_ARGUMENT, "path is empty");
  snprintf(p, sizeof p, "%s/new.ckpt", d);
  CHECK_OK(pmap_params_save_check(p));
  CHECK(entries(d) == 0, "the check of a new file left %d entries in %s", entries(d), d);
  file_write(p, (const unsigned char *)"old", 3);
  CHECK_OK(pmap_params_save_check(p));
  size_t n = 0;
  unsigned char *back = file_read(p, &n);
  CHECK(back && n == 3 && !memcmp(back, "old", 3) && entries(d) == 1,
        "the check changed the file there or left a file beside it");
  free(back);
  remove(p);
  snprintf(p, sizeof p, "%s/no-such-folder/x.ckpt", d);
  CHECK_FAILS(pmap_params_save_check(p), PMAP_ERR_UNAVAILABLE, "cannot create a temporary file");
  CHECK_FAILS(pmap_params_save_check(d), PMAP_ERR_UNAVAILABLE, "not a regular file");
  CHECK_FAILS(pmap_params_save_check("/dev/null"), PMAP_ERR_UNAVAILABLE, "not a regular file");
  snprintf(p, sizeof p, "%s/fifo", d);
  if (mkfifo(p, 0600) == 0) {
    CHECK_FAILS(pmap_params_save_check(p), PMAP_ERR_UNAVAILABLE, "not a regular file");
    remove(p);
  }
  /* A read-only folder (root ignores permissions, so only where the mode has effect). */
  chmod(d, 0555);
  snprintf(p, sizeof p, "%s/x.ckpt", d);
  if (access(d, W_OK) != 0)
    CHECK_FAILS(pmap_params_save_check(p), PMAP_ERR_UNAVAILABLE, "Permission denied");
  chmod(d, 0755);
  CHECK(entries(d) == 0, "%s holds leftovers", d);
  rmdir(d);
}

/* The model section's record of every kind of layer: its code and four geometry words are the
 * file format's (docs/reliability.md), whatever the code that writes them; old checkpoints and
 * the fuzz corpus hold these numbers. */
static void layer_records(void) {
  static const uint32_t want[][6] = {
      /* code, output rank, geometry */
      {3, 3, 3, 3, 1, 1},            /* conv2d 4, 3x3, stride 1, pad 1 */
      {12, 3, 0, 0, 0, 0},           /* batch norm per device */
      {2, 3, 0, 0, 0, 0},            /* relu */
      {9, 3, 2, 2, 1, 0},            /* max pool 2x2 stride 1 */
      {13, 3, 7, 0, 0, 0},           /* residual start: its end */
      {3, 3, 3, 3, 1, 1},            /* conv2d */
      {5, 3, 0, 0, 0, 0},            /* tanh */
      {14, 3, 4, 0, 0, 0},           /* residual end: its start */
      {10, 3, 2, 2, 2, 0},           /* average pool 2x2 stride 2 */
      {12, 3, 1, 0, 0, 0},           /* batch norm across devices */
      {10, 1, 4, 4, 1, 0},           /* global average pool */
      {4, 1, 0, 0, 0, 0},            /* flatten */
      {1, 1, 0, 0, 0, 0},            /* dense 12 */
      {6, 1, 0, 0, 0, 0},            /* sigmoid */
      {11, 1, 0x3e800000u, 0, 0, 0}, /* dropout 0.25 (its bits) */
      {8, 1, 0, 0, 0, 0},            /* layer norm */
      {7, 1, 0, 0, 0, 0},            /* gelu */
      {1, 1, 0, 0, 0, 0},            /* dense 5 */
  };
  enum { L = sizeof want / sizeof want[0] };
  int64_t in[3] = {3, 9, 9};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(3, in, &m));
  CHECK_OK(pmap_model_add_conv2d(m, 4, 3, 3, 1, 1));
  CHECK_OK(pmap_model_add_batchnorm(m, 0));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_maxpool2d(m, 2, 2, 1));
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_conv2d(m, 4, 3, 3, 1, 1));
  CHECK_OK(pmap_model_add_tanh(m));
  CHECK_OK(pmap_model_end_residual(m));
  CHECK_OK(pmap_model_add_avgpool2d(m, 2, 2, 2));
  CHECK_OK(pmap_model_add_batchnorm(m, 1));
  CHECK_OK(pmap_model_add_global_avgpool(m));
  CHECK_OK(pmap_model_add_flatten(m));
  CHECK_OK(pmap_model_add_dense(m, 12));
  CHECK_OK(pmap_model_add_sigmoid(m));
  CHECK_OK(pmap_model_add_dropout(m, 0.25f));
  CHECK_OK(pmap_model_add_layernorm(m));
  CHECK_OK(pmap_model_add_gelu(m));
  CHECK_OK(pmap_model_add_dense(m, 5));
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (ctx && m) CHECK_OK(pmap_params_create(ctx, m, &sgd, 3, &p));
  if (p) CHECK_OK(pmap_params_save(p, scratch));
  size_t n = 0, at[5];
  unsigned char *f = p ? file_read(scratch, &n) : NULL;
  CHECK(f && sections(f, n, at) == 0, "layer records: cannot walk the saved file");
  if (f && sections(f, n, at) == 0) {
    const unsigned char *model = f + at[0] + 16;
    CHECK(rd32(model + 32) == L, "layer records: %u layers, want %d", rd32(model + 32), (int)L);
    for (int i = 0; i < L && rd32(model + 32) == L; i++) {
      const unsigned char *r = model + 48 + 64 * (size_t)i;
      uint32_t got[6] = {rd32(r),      rd32(r + 4),  rd32(r + 48),
                         rd32(r + 52), rd32(r + 56), rd32(r + 60)};
      CHECK(!memcmp(got, want[i], sizeof got),
            "layer %d: code %u, rank %u, geometry %#x %#x %#x %#x; the format says %u, %u, %#x "
            "%#x %#x %#x",
            i, got[0], got[1], got[2], got[3], got[4], got[5], want[i][0], want[i][1], want[i][2],
            want[i][3], want[i][4], want[i][5]);
    }
  }
  free(f);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

int main(void) {
  const char *t = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/pmap-ckpt-XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path_a, sizeof path_a, "%s/a.ckpt", dir);
  snprintf(path_b, sizeof path_b, "%s/b.ckpt", dir);
  snprintf(scratch, sizeof scratch, "%s/scratch.ckpt", dir);
  snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
  for (int n = 1; n <= 3; n++) {
    round_trip("mlp", n, 48 * n, 240);
    round_trip("convnet", n, 6, 36);
  }
  round_trip("linear", 2, 64, 128);
  layer_records();
  corruptions();
  mismatches();
  bad_arguments();
  save_check();
  remove(path_a);
  remove(path_b);
  remove(scratch);
  remove(bad);
  rmdir(dir);
  return test_exit("checkpoint");
}
