/* Statistics users can see (core/agoq_stats.h): the output path's %h/%p expansion, the
 * interval schedule on an injected clock, the line format, the exact-reason counters of the
 * CollNet path (a one-rank group) and of typed p2p (a connected pair and a fake profiler),
 * and the AGOQ_MIN_BYTES warning (the logger captured). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "collnet/agoq_coll_internal.h"
#include "core/agoq_log.h"
#include "core/agoq_params.h"
#include "core/agoq_stats.h"
#include "net/agoq_net_comm.h"
#include "net/agoq_net.h"
#include "profiler/agoq_oracle.h"

#include "net_pair.h"

/* ---- %h / %p --------------------------------------------------------------------------- */

static void test_expand_path(void** state) {
  (void)state;
  char out[64], err[128];
  assert_true(agoq_stats_expand_path("/tmp/s-%h-%p.txt", "node7", 4242, out, sizeof out, err, sizeof err));
  assert_string_equal(out, "/tmp/s-node7-4242.txt");
  assert_true(agoq_stats_expand_path("a%%b%p%p", "h", 1, out, sizeof out, err, sizeof err));
  assert_string_equal(out, "a%b11");
  assert_true(agoq_stats_expand_path("plain", "h", 1, out, sizeof out, err, sizeof err));
  assert_string_equal(out, "plain");
  /* An unknown or dangling '%' is an error that names it, not a silent literal. */
  assert_false(agoq_stats_expand_path("x%d", "h", 1, out, sizeof out, err, sizeof err));
  assert_non_null(strstr(err, "%d"));
  assert_false(agoq_stats_expand_path("x%", "h", 1, out, sizeof out, err, sizeof err));
  /* Too long for the buffer: refused, never truncated into another path. */
  char small[8];
  assert_false(agoq_stats_expand_path("%h", "a-long-hostname", 1, small, sizeof small, err, sizeof err));
  assert_false(agoq_stats_expand_path("1234567%p", "h", 99, small, sizeof small, err, sizeof err));
}

/* ---- the interval schedule, on a clock the test moves ---------------------------------- */

static void test_interval_schedule(void** state) {
  (void)state;
  const int64_t s = 1000000000;
  int64_t next = 0;
  /* Starting arms the first deadline one interval on; nothing is due yet. */
  assert_false(agoq_stats_interval_due(100 * s, 10 * s, &next));
  assert_int_equal(next, 110 * s);
  assert_int_equal(agoq_stats_interval_wait(100 * s, next), 10 * s);
  assert_false(agoq_stats_interval_due(110 * s - 1, 10 * s, &next));
  assert_int_equal(agoq_stats_interval_wait(110 * s - 1, next), 1);
  assert_true(agoq_stats_interval_due(110 * s, 10 * s, &next));
  assert_int_equal(next, 120 * s);
  assert_false(agoq_stats_interval_due(110 * s, 10 * s, &next)); /* once per deadline */
  /* A wake-up 3.5 intervals late reports once and stays on the grid. */
  assert_true(agoq_stats_interval_due(155 * s, 10 * s, &next));
  assert_int_equal(next, 160 * s);
  assert_false(agoq_stats_interval_due(159 * s, 10 * s, &next));
  assert_int_equal(agoq_stats_interval_wait(170 * s, next), 0);
  /* Interval 0 (off) never fires and never arms. */
  int64_t off = 0;
  assert_false(agoq_stats_interval_due(100 * s, 0, &off));
  assert_int_equal(off, 0);
}

/* ---- the line ------------------------------------------------------------------------------ */

static void test_line_format(void** state) {
  (void)state;
  agoq_stats_entry e;
  memset(&e, 0, sizeof e);
  e.kind = AGOQ_STATS_COLLNET;
  e.id = 7;
  e.comm = 0xabc0;
  e.rank = 1;
  e.nranks = 4;
  snprintf(e.config, sizeof e.config, "format=int8 block=128 min_bytes=65536");
  agoq_stats_count(&e, AGOQ_STATS_QUANT, 1000);
  agoq_stats_wire(&e, AGOQ_STATS_QUANT, 1000, 516);
  agoq_stats_add(&e.path[AGOQ_STATS_QUANT].codec_ns, 2500000);
  agoq_stats_add(&e.path[AGOQ_STATS_QUANT].crc_ns, 250000);
  agoq_stats_add(&e.path[AGOQ_STATS_QUANT].wire_ns, 1000);
  agoq_stats_device(&e, AGOQ_STATS_QUANT, 516, 0);
  agoq_stats_add(&e.path[AGOQ_STATS_QUANT].gpu_ns, 1234567);
  agoq_stats_count(&e, AGOQ_STATS_EXACT, 10);
  agoq_stats_count(&e, AGOQ_STATS_EXACT, 20);
  agoq_stats_exact(&e, AGOQ_EXACT_SMALL);
  agoq_stats_exact(&e, AGOQ_EXACT_OP);
  agoq_stats_exact(&e, AGOQ_EXACT_REASONS); /* out of range: ignored */
  char line[1024];
  size_t n = agoq_stats_format(&e, AGOQ_STATS_QUANT, "exit", "h1", 99, line, sizeof line);
  assert_true(n > 0 && n == strlen(line) && line[n - 1] == '\n');
  assert_string_equal(line,
                      "agoq-stats pid=99 host=h1 event=exit id=7 comm=0xabc0 kind=collnet rank=1 nranks=4 "
                      "path=quantized calls=1 bytes_in=1000 wire_raw=1000 wire_bytes=516 ratio=0.516 codec_ms=2.500 "
                      "crc_ms=0.250 wire_ms=0.001 device_calls=1 pcie_d2h=516 pcie_h2d=0 gpu_ms=1.235 format=int8 block=128 "
                      "min_bytes=65536\n");
  n = agoq_stats_format(&e, AGOQ_STATS_EXACT, "close", "h1", 99, line, sizeof line);
  assert_true(n > 0);
  assert_non_null(strstr(line, " path=exact calls=2 bytes_in=30 wire_raw=0 wire_bytes=0 ratio=1.000 "));
  assert_non_null(strstr(line, " exact_type=0 exact_op=1 exact_small=1 exact_ll=0 exact_unknown=0 "
                               "exact_format_none=0 exact_collective=0 exact_nogain=0 exact_one_way=0 exact_unaligned=0\n"));
  /* p2p lines carry no rank; a buffer too small gives nothing rather than half a line. */
  e.kind = AGOQ_STATS_P2P_SEND;
  n = agoq_stats_format(&e, AGOQ_STATS_EXACT, "close", "h1", 99, line, sizeof line);
  assert_non_null(strstr(line, " kind=p2p_send path=exact "));
  assert_null(strstr(line, "rank="));
  assert_int_equal(agoq_stats_format(&e, AGOQ_STATS_EXACT, "close", "h1", 99, line, 40), 0);
}

/* ---- CollNet: why each exact call went exact ------------------------------------------- */

static void coll_env(const char* format, const char* min_bytes) {
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  setenv("AGOQ_FORMAT", format, 1);
  setenv("AGOQ_MIN_BYTES", min_bytes, 1);
  setenv("AGOQ_STATS", "1", 1);
  unsetenv("AGOQ_STATS_FILE");
  agoq_params_reset();
}

static void coll_call(agoq_coll_comm* g, void* send, void* recv, size_t count, int dtype, int op) {
  void* req = NULL;
  while (req == NULL) assert_int_equal(agoq_coll_iallreduce(g, send, recv, count, dtype, op, NULL, NULL, &req), ncclSuccess);
  int done = 0, size = 0;
  double deadline = now_s() + 30;
  while (!done && now_s() < deadline) assert_int_equal(agoq_coll_test(req, &done, &size), ncclSuccess);
  assert_true(done);
}

/* A group of one rank: every call runs through the same request and engine code. */
static agoq_coll_comm* coll_open(void** ctx, void** listen) {
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
  assert_int_equal(agoq_coll_init(ctx, 0x5151, NULL), ncclSuccess);
  assert_int_equal(agoq_coll_listen(*ctx, 0, handle, listen), ncclSuccess);
  void* handles[1] = {handle};
  void* g = NULL;
  assert_int_equal(agoq_coll_connect(handles, 1, 0, *listen, &g), ncclSuccess);
  assert_non_null(g);
  return g;
}

static void coll_close(void* ctx, void* listen, agoq_coll_comm* g) {
  assert_int_equal(agoq_coll_close_listen(listen), ncclSuccess);
  assert_int_equal(agoq_coll_close_coll(g), ncclSuccess);
  assert_int_equal(agoq_coll_finalize(ctx), ncclSuccess);
}

static void test_collnet_exact_reasons(void** state) {
  (void)state;
  coll_env("int8", "64K");
  void *ctx, *listen;
  agoq_coll_comm* g = coll_open(&ctx, &listen);
  agoq_stats_entry* e = g->st;
  assert_true(e->registered);
  size_t big = 1u << 16; /* 64K elements */
  float* send = calloc(big, sizeof(float));
  float* recv = calloc(big, sizeof(float));
  coll_call(g, send, recv, big, ncclFloat32, ncclSum);        /* 256 KiB fp32 Sum: quantized */
  coll_call(g, send, recv, big / 2, ncclBfloat16, ncclSum);   /* 64 KiB bf16: at the threshold, quantized */
  coll_call(g, send, recv, 1024, ncclFloat32, ncclSum);       /* 4 KiB: small */
  coll_call(g, send, recv, big / 2 - 1, ncclBfloat16, ncclSum); /* one element below: small */
  coll_call(g, send, recv, big, ncclInt32, ncclSum);          /* type */
  coll_call(g, send, recv, big / 2, ncclFloat64, ncclSum);    /* type */
  coll_call(g, send, recv, big, ncclFloat32, ncclMax);        /* op */
  coll_call(g, send, recv, 16, ncclInt32, ncclMax);           /* type first, then op, then size */
  assert_int_equal(agoq_stats_get(&e->path[AGOQ_STATS_QUANT].calls), 2);
  assert_int_equal(agoq_stats_get(&e->path[AGOQ_STATS_QUANT].bytes_in), big * 4 + big);
  assert_int_equal(agoq_stats_get(&e->path[AGOQ_STATS_EXACT].calls), 6);
  assert_int_equal(agoq_stats_get(&e->exact[AGOQ_EXACT_SMALL]), 2);
  assert_int_equal(agoq_stats_get(&e->exact[AGOQ_EXACT_TYPE]), 3);
  assert_int_equal(agoq_stats_get(&e->exact[AGOQ_EXACT_OP]), 1);
  assert_int_equal(agoq_stats_get(&e->exact[AGOQ_EXACT_FORMAT_NONE]), 0);
  assert_string_equal(e->config, "format=int8 block=128 min_bytes=65536 chunk=1048576");
  coll_close(ctx, listen, g);
  assert_int_equal(atomic_load(&e->closed), 1); /* kept in the registry, closed */

  /* AGOQ_FORMAT=none: every call is counted under format_none, whatever else it is. */
  coll_env("none", "64K");
  g = coll_open(&ctx, &listen);
  e = g->st;
  coll_call(g, send, recv, big, ncclFloat32, ncclSum);
  coll_call(g, send, recv, 16, ncclInt32, ncclMax);
  assert_int_equal(agoq_stats_get(&e->path[AGOQ_STATS_QUANT].calls), 0);
  assert_int_equal(agoq_stats_get(&e->exact[AGOQ_EXACT_FORMAT_NONE]), 2);
  coll_close(ctx, listen, g);
  free(send);
  free(recv);
}

/* With statistics off the group still counts (private entry), and nothing is registered. */
static void test_collnet_stats_off(void** state) {
  (void)state;
  coll_env("int8", "64K");
  setenv("AGOQ_STATS", "0", 1);
  agoq_params_reset();
  void *ctx, *listen;
  agoq_coll_comm* g = coll_open(&ctx, &listen);
  assert_non_null(g->st);
  assert_false(g->st->registered);
  float buf[64] = {0}, out[64];
  coll_call(g, buf, out, 64, ncclFloat32, ncclSum);
  assert_int_equal(agoq_stats_get(&g->st->exact[AGOQ_EXACT_SMALL]), 1);
  coll_close(ctx, listen, g);
}

/* ---- typed p2p: why each message went exact -------------------------------------------- */

static void one_message(pair* p, const void* src, size_t n, fake_step* step, void* dst) {
  void *sreq = NULL, *rreq = NULL;
  int tag = 3;
  size_t posted = n + 64;
  while (rreq == NULL) assert_int_equal(agoq_net_irecv(p->recv, 1, &dst, &posted, &tag, NULL, NULL, &rreq), ncclSuccess);
  while (sreq == NULL) assert_int_equal(agoq_net_isend(p->send, (void*)src, n, tag, NULL, step, &sreq), ncclSuccess);
  int sdone = 0, rdone = 0, size;
  double deadline = now_s() + 30;
  while ((!sdone || !rdone) && now_s() < deadline) {
    if (!sdone) assert_int_equal(agoq_net_test(sreq, &sdone, &size), ncclSuccess);
    if (!rdone) assert_int_equal(agoq_net_test(rreq, &rdone, &size), ncclSuccess);
  }
  assert_true(sdone && rdone);
}

static void test_p2p_exact_reasons(void** state) {
  (void)state;
  p2p_env();
  agoq_params_reset();
  agoq_typed_policy_load(); /* the transport reads it once per process */
  pair p;
  pair_open_ex(&p, 0x7171, fake_prof);
  agoq_stats_entry* snd = ((agoq_comm*)p.send)->st;
  agoq_stats_entry* rcv = ((agoq_comm*)p.recv)->st;
  assert_non_null(snd);
  assert_non_null(rcv);
  assert_ptr_not_equal(snd, rcv);
  const size_t n = 1u << 18; /* 256 KiB */
  uint16_t* src = malloc(n);
  uint8_t* dst = malloc(n + 64);
  for (size_t i = 0; i < n / 2; i++) src[i] = (uint16_t)(0x3f80 + (i % 64)); /* bf16 near 1 */
  fake_step good = step_of(AGOQ_XFER_P2P, 9 /* bf16 */, AGOQ_XFER_PROTO_SIMPLE, 1);
  fake_step ll = step_of(AGOQ_XFER_P2P, 9, AGOQ_XFER_PROTO_LL, 1);
  fake_step integer = step_of(AGOQ_XFER_P2P, 2 /* int32 */, AGOQ_XFER_PROTO_SIMPLE, 1);
  fake_step ring = step_of(AGOQ_XFER_COLL, 9, AGOQ_XFER_PROTO_SIMPLE, 1);
  fake_step silent = {.answer = false};
  one_message(&p, src, n, &good, dst);      /* quantized */
  one_message(&p, src, n, &ll, dst);        /* ll */
  one_message(&p, src, n, &integer, dst);   /* type */
  one_message(&p, src, n, &ring, dst);      /* collective */
  one_message(&p, src, n, &silent, dst);    /* unknown: no oracle answer */
  one_message(&p, src, n, NULL, dst);       /* unknown: no profiler handle */
  one_message(&p, src, 4096, &good, dst);   /* small */
  assert_int_equal(agoq_stats_get(&snd->path[AGOQ_STATS_QUANT].calls), 1);
  assert_int_equal(agoq_stats_get(&snd->path[AGOQ_STATS_QUANT].bytes_in), n);
  uint64_t wire = agoq_stats_get(&snd->path[AGOQ_STATS_QUANT].wire_bytes);
  assert_true(wire > 0 && wire < n * 6 / 10); /* bf16 -> int8 + scales: ~0.52 */
  assert_int_equal(agoq_stats_get(&snd->path[AGOQ_STATS_EXACT].calls), 6);
  assert_int_equal(agoq_stats_get(&snd->exact[AGOQ_EXACT_LL]), 1);
  assert_int_equal(agoq_stats_get(&snd->exact[AGOQ_EXACT_TYPE]), 1);
  assert_int_equal(agoq_stats_get(&snd->exact[AGOQ_EXACT_COLLECTIVE]), 1);
  assert_int_equal(agoq_stats_get(&snd->exact[AGOQ_EXACT_UNKNOWN]), 2);
  assert_int_equal(agoq_stats_get(&snd->exact[AGOQ_EXACT_SMALL]), 1);
  /* The receiver sees the same split: one frame decoded, six messages as they were. */
  assert_int_equal(agoq_stats_get(&rcv->path[AGOQ_STATS_QUANT].calls), 1);
  assert_int_equal(agoq_stats_get(&rcv->path[AGOQ_STATS_QUANT].bytes_in), n);
  assert_int_equal(agoq_stats_get(&rcv->path[AGOQ_STATS_QUANT].wire_bytes), wire);
  assert_int_equal(agoq_stats_get(&rcv->path[AGOQ_STATS_EXACT].calls), 6);
  pair_close(&p);
  assert_int_equal(atomic_load(&snd->closed), 1);
  free(src);
  free(dst);
}

/* ---- AGOQ_MIN_BYTES above NCCL's largest staged CollNet call ---------------------------- */

static char captured[4096];
static int captured_warns;

static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) __attribute__((format(printf, 5, 6)));
static void capture_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt,
                        ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level != NCCL_LOG_WARN) return;
  char msg[sizeof captured];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (strstr(msg, "AGOQ_MIN_BYTES") == NULL) return; /* other init warnings are not this test's */
  memcpy(captured, msg, sizeof captured);
  captured_warns++;
}

/* What the documentation promises about the spellings of a size. */
static void test_size_units(void** state) {
  (void)state;
  const agoq_param_desc* d = agoq_param_describe(AGOQ_PARAM_MIN_BYTES);
  const char* mib[] = {"1M", "1MB", "1MiB", "1m", "1048576", "1048576B"};
  for (size_t i = 0; i < sizeof mib / sizeof mib[0]; i++) {
    int64_t v = 0;
    assert_int_equal(agoq_param_parse(d, mib[i], &v, NULL, 0), ncclSuccess);
    assert_int_equal(v, 1048576);
  }
  int64_t v = 0;
  assert_int_equal(agoq_param_parse(d, "64KB", &v, NULL, 0), ncclSuccess);
  assert_int_equal(v, 65536);
  char err[256];
  assert_int_equal(agoq_param_parse(d, "1.5M", &v, err, sizeof err), ncclInvalidUsage);
  assert_non_null(strstr(err, "powers of 1024"));
}

static void test_min_bytes_warning(void** state) {
  (void)state;
  agoq_log_set_logger(capture_log);
  captured_warns = 0;
  /* 2 MiB is still reachable: no warning. */
  assert_false(agoq_coll_min_bytes_check(2u << 20));
  assert_false(agoq_coll_min_bytes_check(65536));
  assert_int_equal(captured_warns, 0);
  /* Through CollNet init, as a user sets it: once per process, with numbers and units. */
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  setenv("AGOQ_MIN_BYTES", "4MiB", 1);
  agoq_params_reset();
  void* ctx = NULL;
  assert_int_equal(agoq_coll_init(&ctx, 0x6161, capture_log), ncclSuccess);
  assert_int_equal(captured_warns, 1);
  assert_non_null(strstr(captured, "AGOQ_MIN_BYTES=4194304 bytes (4.00 MiB)"));
  assert_non_null(strstr(captured, "2097152 bytes = 2 MiB"));
  assert_non_null(strstr(captured, "exact"));
  assert_non_null(strstr(captured, "1M = 1MiB = 1048576 bytes"));
  void* ctx2 = NULL;
  assert_int_equal(agoq_coll_init(&ctx2, 0x6162, capture_log), ncclSuccess);
  assert_int_equal(captured_warns, 1);
  assert_false(agoq_coll_min_bytes_check(8u << 20));
  assert_int_equal(agoq_coll_finalize(ctx), ncclSuccess);
  assert_int_equal(agoq_coll_finalize(ctx2), ncclSuccess);
  agoq_log_set_logger(NULL);
  unsetenv("AGOQ_MIN_BYTES");
  agoq_params_reset();
}

/* ---- the output file: %p expanded, lines appended, one per path -------------------------- */

static void test_stats_file(void** state) {
  (void)state;
  char dir[] = "/tmp/agoq-test-stats-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char pattern[128], path[160];
  snprintf(pattern, sizeof pattern, "%s/%%p.txt", dir);
  snprintf(path, sizeof path, "%s/%d.txt", dir, (int)getpid());
  setenv("AGOQ_STATS", "1", 1);
  setenv("AGOQ_STATS_FILE", pattern, 1);
  setenv("AGOQ_FORMAT", "int8", 1);
  setenv("AGOQ_MIN_BYTES", "64K", 1);
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  agoq_params_reset();
  /* The output is opened by the first registration of the process: a fresh child. */
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    snprintf(path, sizeof path, "%s/%d.txt", dir, (int)getpid());
    void *ctx, *listen;
    agoq_coll_comm* g = coll_open(&ctx, &listen);
    float buf[64] = {0}, out[64];
    coll_call(g, buf, out, 64, ncclFloat32, ncclSum);
    coll_call(g, buf, out, 64, ncclInt32, ncclSum);
    coll_close(ctx, listen, g);
    FILE* f = fopen(path, "r");
    int ok = f != NULL;
    char line[1024];
    int lines = 0, exact_ok = 0;
    while (ok && fgets(line, sizeof line, f) != NULL) {
      if (strncmp(line, "agoq-stats ", 11) != 0) continue;
      lines++;
      if (strstr(line, "event=close") && strstr(line, "path=exact calls=2 ") && strstr(line, "exact_small=1") &&
          strstr(line, "exact_type=1"))
        exact_ok = 1;
    }
    if (f != NULL) fclose(f);
    unlink(path);
    _exit(ok && lines == 2 && exact_ok ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  rmdir(dir);
  unsetenv("AGOQ_STATS_FILE");
  agoq_params_reset();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expand_path),
      cmocka_unit_test(test_interval_schedule),
      cmocka_unit_test(test_line_format),
      cmocka_unit_test(test_size_units),
      cmocka_unit_test(test_min_bytes_warning),
      cmocka_unit_test(test_collnet_exact_reasons),
      cmocka_unit_test(test_collnet_stats_off),
      cmocka_unit_test(test_p2p_exact_reasons),
      cmocka_unit_test(test_stats_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
