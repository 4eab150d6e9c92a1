/* Socket options of the TCP transport: AGOQ_SOCKET_CC (congestion control), and what the
 * "auto" buffer sizes and inline threshold become, as decisions and on real sockets. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "transport/tcp/agoq_tcp.h"

static void test_cc_resolve(void** state) {
  (void)state;
  agoq_transport_config c;
  memset(&c, 0, sizeof c);
  assert_int_equal(agoq_tcp_cc_resolve(&c, "auto"), ncclSuccess);
  assert_true(c.cc_auto);
  assert_string_equal(c.cc, "");
  assert_int_equal(agoq_tcp_cc_resolve(&c, "system"), ncclSuccess);
  assert_false(c.cc_auto);
  assert_string_equal(c.cc, "");
  assert_int_equal(agoq_tcp_cc_resolve(&c, ""), ncclSuccess);
  assert_false(c.cc_auto);
  /* A name is asked of the kernel at resolve time, as every socket will ask it: reno is
   * built into every Linux kernel and allowed to every process. */
  assert_int_equal(agoq_tcp_cc_resolve(&c, "reno"), ncclSuccess);
  assert_false(c.cc_auto);
  assert_string_equal(c.cc, "reno");
  /* Well-formed names no kernel has are refused at init, not left to a WARN at connect. */
  memset(&c, 0, sizeof c);
  assert_int_equal(agoq_tcp_cc_resolve(&c, "bbr_2"), ncclInvalidArgument);
  assert_string_equal(c.cc, "");
  assert_int_equal(agoq_tcp_cc_resolve(&c, "abcdefghijklmno"), ncclInvalidArgument);
  /* 16 characters do not fit TCP_CA_NAME_MAX with its NUL: refused before the kernel. */
  assert_int_equal(agoq_tcp_cc_resolve(&c, "abcdefghijklmnop"), ncclInvalidArgument);
  assert_int_equal(agoq_tcp_cc_resolve(&c, "Cubic"), ncclInvalidArgument);
  assert_int_equal(agoq_tcp_cc_resolve(&c, "cubic reno"), ncclInvalidArgument);
  assert_int_equal(agoq_tcp_cc_resolve(&c, "../cubic"), ncclInvalidArgument);
}

static void test_cc_choice(void** state) {
  (void)state;
  agoq_transport_config c;
  memset(&c, 0, sizeof c);
  const char* out[2] = {NULL, NULL};
  /* auto: only a pacing algorithm on loopback changes, to cubic, else reno. */
  assert_int_equal(agoq_tcp_cc_resolve(&c, "auto"), ncclSuccess);
  assert_int_equal(agoq_tcp_cc_choice(&c, true, "bbr", out), 2);
  assert_string_equal(out[0], "cubic");
  assert_string_equal(out[1], "reno");
  assert_int_equal(agoq_tcp_cc_choice(&c, true, "bbr3", out), 2);
  assert_int_equal(agoq_tcp_cc_choice(&c, false, "bbr", out), 0);
  assert_int_equal(agoq_tcp_cc_choice(&c, true, "cubic", out), 0);
  assert_int_equal(agoq_tcp_cc_choice(&c, true, "reno", out), 0);
  /* system: never. */
  assert_int_equal(agoq_tcp_cc_resolve(&c, "system"), ncclSuccess);
  assert_int_equal(agoq_tcp_cc_choice(&c, true, "bbr", out), 0);
  /* A name: every socket, loopback or not, unless it already has it. */
  assert_int_equal(agoq_tcp_cc_resolve(&c, "reno"), ncclSuccess);
  assert_int_equal(agoq_tcp_cc_choice(&c, false, "cubic", out), 1);
  assert_string_equal(out[0], "reno");
  assert_int_equal(agoq_tcp_cc_choice(&c, true, "bbr", out), 1);
  assert_int_equal(agoq_tcp_cc_choice(&c, false, "reno", out), 0);
  assert_true(agoq_tcp_cc_paces("bbr"));
  assert_true(agoq_tcp_cc_paces("bbr3"));
  assert_false(agoq_tcp_cc_paces("cubic"));
  assert_false(agoq_tcp_cc_paces("reno"));
  assert_false(agoq_tcp_cc_paces(""));
  char eff[16];
  agoq_tcp_cc_effective(&c, 0, eff);
  assert_string_equal(eff, "reno"); /* the configured one, whatever the system's is */
}

/* A connected loopback pair (IPv4), both ends returned. */
static void loopback_pair(int* a, int* b) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(l >= 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(l, (struct sockaddr*)&sa, sizeof sa), 0);
  assert_int_equal(listen(l, 1), 0);
  socklen_t len = sizeof sa;
  assert_int_equal(getsockname(l, (struct sockaddr*)&sa, &len), 0);
  *a = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(*a >= 0);
  assert_int_equal(connect(*a, (struct sockaddr*)&sa, sizeof sa), 0);
  *b = accept(l, NULL, NULL);
  assert_true(*b >= 0);
  close(l);
}

static void socket_cc(int fd, char* out, size_t cap) {
  memset(out, 0, cap);
  socklen_t len = (socklen_t)(cap - 1);
  assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, out, &len), 0);
}

/* agoq_socket_configure really sets what the decision says on a live socket. reno is
 * built into every kernel and allowed by default. */
static void test_cc_on_socket(void** state) {
  (void)state;
  int a, b;
  loopback_pair(&a, &b);
  char before[16], after[16];
  socket_cc(a, before, sizeof before);

  agoq_transport_config saved = agoq_config;
  /* Device 0 is lo, as the sockets are. */
  agoq_config.nifs = 1;
  memset(&agoq_config.ifs[0], 0, sizeof agoq_config.ifs[0]);
  agoq_config.ifs[0].addr.ss_family = AF_INET;
  ((struct sockaddr_in*)&agoq_config.ifs[0].addr)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);

  assert_int_equal(agoq_tcp_cc_resolve(&agoq_config, "reno"), ncclSuccess);
  assert_int_equal(agoq_socket_configure(a, 0, "test"), ncclSuccess);
  socket_cc(a, after, sizeof after);
  if (strcmp(after, "reno") != 0 && strcmp(before, "reno") != 0) {
    /* Only an administrator's tcp_allowed_congestion_control without reno refuses it. */
    fprintf(stderr, "the kernel refused reno (socket stays %s)\n", after);
    agoq_config = saved;
    close(a);
    close(b);
    skip();
  }
  assert_string_equal(after, "reno");

  /* system: left alone (the socket set to reno above stays reno, the other keeps the
   * system's default). */
  assert_int_equal(agoq_tcp_cc_resolve(&agoq_config, "system"), ncclSuccess);
  assert_int_equal(agoq_socket_configure(a, 0, "test"), ncclSuccess);
  socket_cc(a, after, sizeof after);
  assert_string_equal(after, "reno");
  assert_int_equal(agoq_socket_configure(b, 0, "test"), ncclSuccess);
  socket_cc(b, after, sizeof after);
  assert_string_equal(after, before);
  char eff[16];
  agoq_tcp_cc_effective(&agoq_config, 0, eff);
  assert_string_equal(eff, before); /* what a fresh socket gets */

  /* auto on a loopback device: a pacing default is replaced, any other stays. */
  assert_int_equal(agoq_tcp_cc_resolve(&agoq_config, "auto"), ncclSuccess);
  assert_int_equal(agoq_socket_configure(b, 0, "test"), ncclSuccess);
  socket_cc(b, after, sizeof after);
  if (agoq_tcp_cc_paces(before))
    assert_true(strcmp(after, "cubic") == 0 || strcmp(after, "reno") == 0);
  else
    assert_string_equal(after, before);
  agoq_config = saved;
  close(a);
  close(b);
}

/* Two interfaces: lo (127.0.0.1) and 10.0.0.1. */
static void two_ifs(agoq_transport_config* c) {
  memset(c, 0, sizeof *c);
  c->nifs = 2;
  c->ifs[0].addr.ss_family = AF_INET;
  ((struct sockaddr_in*)&c->ifs[0].addr)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  c->ifs[1].addr.ss_family = AF_INET;
  ((struct sockaddr_in*)&c->ifs[1].addr)->sin_addr.s_addr = htonl(0x0a000001u);
}

static void test_buffer_sizes(void** state) {
  (void)state;
  agoq_transport_config c;
  two_ifs(&c);
  c.sndbuf = c.rcvbuf = AGOQ_TCP_BUF_AUTO;
  int snd = -5, rcv = -5;
  /* auto: fixed sizes only on loopback under a pacing algorithm. */
  agoq_tcp_buffer_sizes(&c, 0, true, &snd, &rcv);
  assert_int_equal(snd, AGOQ_TCP_LOOPBACK_SNDBUF);
  assert_int_equal(rcv, AGOQ_TCP_LOOPBACK_RCVBUF);
  agoq_tcp_buffer_sizes(&c, 0, false, &snd, &rcv);
  assert_int_equal(snd, 0);
  assert_int_equal(rcv, 0);
  agoq_tcp_buffer_sizes(&c, 1, true, &snd, &rcv);
  assert_int_equal(snd, 0);
  assert_int_equal(rcv, 0);
  /* A number is a number, whatever the algorithm. */
  c.sndbuf = 4096;
  c.rcvbuf = 0;
  agoq_tcp_buffer_sizes(&c, 0, false, &snd, &rcv);
  assert_int_equal(snd, 4096);
  assert_int_equal(rcv, 0);
}

static void test_inline_max(void** state) {
  (void)state;
  agoq_transport_config c;
  two_ifs(&c);
  c.inline_max = AGOQ_TCP_INLINE_AUTO;
  assert_true(agoq_tcp_inline_max(&c, 0, false) == UINT64_MAX); /* loopback, cubic: all inline */
  assert_true(agoq_tcp_inline_max(&c, 0, true) == (uint64_t)AGOQ_TCP_INLINE_DEFAULT);
  assert_true(agoq_tcp_inline_max(&c, 1, false) == (uint64_t)AGOQ_TCP_INLINE_DEFAULT);
  assert_true(agoq_tcp_inline_max(&c, 1, true) == (uint64_t)AGOQ_TCP_INLINE_DEFAULT);
  c.inline_max = 4096;
  assert_true(agoq_tcp_inline_max(&c, 0, false) == 4096);
  c.inline_max = 0;
  assert_true(agoq_tcp_inline_max(&c, 0, false) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cc_resolve),
      cmocka_unit_test(test_cc_choice),
      cmocka_unit_test(test_cc_on_socket),
      cmocka_unit_test(test_buffer_sizes),
      cmocka_unit_test(test_inline_max),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
