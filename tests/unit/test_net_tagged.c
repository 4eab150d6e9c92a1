/* Tagged receive comms (AGOQ_NET_TAGGED, plugin/net/agoq_net_tagged.c) over the TCP
 * transport in one process: each message reaches the receive of its tag whatever the order
 * receives and messages come in; a message that arrives first is held and copied; ANY takes
 * the oldest; a message larger than its receive is an error; at most AGOQ_NET_TAGGED_DEPTH
 * messages are held, the rest wait in the transport until receives claim the held ones.
 * Every case runs on inline connections (CollNet's) and, in test_net_tagged_pieces, with
 * the payloads on the data sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "net/agoq_net.h"

#define COMM_ID 0x7a66ed5eed000001ull
#define MSG 3000 /* bytes of each message; MSG - 1 posted is truncation */

#include "net_pair.h"

static unsigned conn_flags; /* the transport's flags of the pair (AGOQ_TP_LISTEN_INLINE or 0) */

static int setup_env(void** state) {
  (void)state;
  setenv("AGOQ_SOCKET_IFNAME", "lo", 1);
  setenv("AGOQ_SOCKET_FAMILY", "ipv4", 1);
  const char* inl = getenv("AGOQ_SOCKET_INLINE");
  conn_flags = AGOQ_TP_FEW | (inl != NULL && strcmp(inl, "0") == 0 ? 0u : AGOQ_TP_LISTEN_INLINE);
  return 0;
}

static void tagged_open(pair* p) {
  memset(p, 0, sizeof *p);
  assert_int_equal(agoq_net_init(&p->ctx, COMM_ID, -1, NULL, NULL), ncclSuccess);
  assert_int_equal(agoq_net_listen_flags(p->ctx, 0, conn_flags | AGOQ_NET_TAGGED, p->handle, &p->listen),
                   ncclSuccess);
  double deadline = now_s() + 10;
  while ((p->send == NULL || p->recv == NULL) && now_s() < deadline) {
    if (p->send == NULL) assert_int_equal(agoq_net_connect_flags(p->ctx, 0, conn_flags, p->handle, &p->send), ncclSuccess);
    if (p->recv == NULL) assert_int_equal(agoq_net_accept(p->listen, &p->recv), ncclSuccess);
  }
  assert_non_null(p->send);
  assert_non_null(p->recv);
}

static void fill(uint8_t* buf, size_t n, int tag) {
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)((i * 2654435761u) >> 11 ^ (unsigned)tag * 40503u);
}

static void* post_send(pair* p, const uint8_t* data, size_t n, int tag) {
  void* req = NULL;
  double deadline = now_s() + 30;
  while (req == NULL && now_s() < deadline)
    assert_int_equal(agoq_net_isend(p->send, (void*)data, n, tag, NULL, NULL, &req), ncclSuccess);
  assert_non_null(req);
  return req;
}

static void* post_recv(pair* p, uint8_t* data, size_t n, int tag) {
  void* req = NULL;
  void* bufs[1] = {data};
  assert_int_equal(agoq_net_irecv(p->recv, 1, bufs, &n, &tag, NULL, NULL, &req), ncclSuccess);
  assert_non_null(req);
  return req;
}

/* Tests req until done (the receive's size), failing the test after 30 s. */
static int wait_done(void* req) {
  int done = 0, size = -1;
  double deadline = now_s() + 30;
  while (!done && now_s() < deadline) assert_int_equal(agoq_net_test(req, &done, &size), ncclSuccess);
  assert_true(done);
  return size;
}

/* Sends tags[0..n) in that order, each send completed before the next (the transport has
 * them all, whatever the receiver posted). */
static void send_all(pair* p, uint8_t (*out)[MSG], const int* tags, int n) {
  for (int i = 0; i < n; i++) {
    fill(out[i], MSG, tags[i]);
    assert_int_equal(wait_done(post_send(p, out[i], MSG, tags[i])), MSG);
  }
}

static void check(const uint8_t* got, int tag) {
  uint8_t want[MSG];
  fill(want, MSG, tag);
  assert_memory_equal(got, want, MSG);
}

/* Receives posted in the reverse order of the messages, before any message is sent: each
 * message goes straight into the receive of its tag. */
static void test_posted_receives_match_by_tag(void** state) {
  (void)state;
  pair p;
  tagged_open(&p);
  enum { N = 6 };
  static uint8_t in[N][MSG], out[N][MSG];
  void* r[N];
  int tags[N];
  for (int i = 0; i < N; i++) tags[i] = 100 + 7 * i;
  for (int i = N - 1; i >= 0; i--) r[i] = post_recv(&p, in[i], MSG, tags[i]);
  send_all(&p, out, tags, N);
  for (int i = 0; i < N; i++) {
    assert_int_equal(wait_done(r[i]), MSG);
    check(in[i], tags[i]);
  }
  pair_close(&p);
}

/* Every message arrives before any receive: held, then copied into the receive of its tag,
 * receives posted in a scrambled order. */
static void test_early_messages_are_held(void** state) {
  (void)state;
  pair p;
  tagged_open(&p);
  enum { N = 8 };
  static uint8_t in[N][MSG], out[N][MSG];
  int tags[N] = {5, 1, 9, 3, 7, 2, 8, 4};
  send_all(&p, out, tags, N);
  int order[N] = {3, 0, 7, 5, 1, 6, 2, 4};
  for (int k = 0; k < N; k++) {
    int i = order[k];
    assert_int_equal(wait_done(post_recv(&p, in[i], MSG, tags[i])), MSG);
    check(in[i], tags[i]);
  }
  pair_close(&p);
}

/* AGOQ_NET_TAG_ANY takes the oldest message of any tag, held or not. */
static void test_any_takes_the_oldest(void** state) {
  (void)state;
  pair p;
  tagged_open(&p);
  static uint8_t in[3][MSG], out[3][MSG];
  int tags[3] = {42, 17, 99};
  send_all(&p, out, tags, 3);
  assert_int_equal(wait_done(post_recv(&p, in[1], MSG, 17)), MSG);
  check(in[1], 17);
  assert_int_equal(wait_done(post_recv(&p, in[0], MSG, AGOQ_NET_TAG_ANY)), MSG);
  check(in[0], 42);
  assert_int_equal(wait_done(post_recv(&p, in[2], MSG, AGOQ_NET_TAG_ANY)), MSG);
  check(in[2], 99);
  pair_close(&p);
}

/* More messages than the comm holds: the first AGOQ_NET_TAGGED_DEPTH are held and the rest
 * stay in the transport, so the receive of the last tag cannot complete; once receives
 * claim the held ones, everything arrives, each into the receive of its tag. */
static void test_held_messages_are_bounded(void** state) {
  (void)state;
  pair p;
  tagged_open(&p);
  enum { N = 2 * AGOQ_NET_TAGGED_DEPTH };
  static uint8_t in[N][MSG], out[N][MSG];
  int tags[N];
  for (int i = 0; i < N; i++) tags[i] = i;
  send_all(&p, out, tags, N);
  void* last = post_recv(&p, in[N - 1], MSG, tags[N - 1]);
  int done = 0, size = -1;
  for (int k = 0; k < 1000; k++) assert_int_equal(agoq_net_test(last, &done, &size), ncclSuccess);
  assert_false(done); /* behind D held messages nobody claimed */
  /* Claiming a held message frees its place for the next one the transport has. */
  for (int i = 0; i < N - 1; i++) {
    assert_int_equal(wait_done(post_recv(&p, in[i], MSG, tags[i])), MSG);
    check(in[i], tags[i]);
  }
  assert_int_equal(wait_done(last), MSG);
  check(in[N - 1], tags[N - 1]);
  pair_close(&p);
}

/* A message larger than the receive of its tag fails the connection, whether it was held
 * (irecv says so) or the receive was posted first (test says so); never a partial copy. */
static void test_truncation_is_an_error(void** state) {
  (void)state;
  static uint8_t in[MSG], out[2][MSG];
  pair p;
  tagged_open(&p);
  int tag = 5, tags[2] = {5, 6};
  send_all(&p, out, tags, 2);
  /* Held first: once tag 6, sent after it, is in, tag 5's message has reached the comm. */
  assert_int_equal(wait_done(post_recv(&p, in, MSG, 6)), MSG);
  int done = 0, size = -1;
  void* req = NULL;
  void* bufs[1] = {in};
  size_t small = MSG - 1;
  memset(in, 0, sizeof in);
  assert_int_equal(agoq_net_irecv(p.recv, 1, bufs, &small, &tag, NULL, NULL, &req), ncclInvalidUsage);
  assert_null(req);
  for (size_t i = 0; i < MSG; i++) assert_int_equal(in[i], 0);
  pair_close(&p);

  tagged_open(&p);
  req = post_recv(&p, in, MSG - 1, tag);
  (void)post_send(&p, out[0], MSG, tag);
  ncclResult_t res = ncclSuccess;
  double deadline = now_s() + 30;
  done = 0;
  while (res == ncclSuccess && !done && now_s() < deadline) res = agoq_net_test(req, &done, &size);
  assert_false(done);
  assert_int_equal(res, ncclInvalidUsage);
  pair_close(&p);
}

/* Grouped receives and device memory have no tagged form: refused, not misrouted. */
static void test_grouped_receive_refused(void** state) {
  (void)state;
  pair p;
  tagged_open(&p);
  static uint8_t a[16], b[16];
  void* bufs[2] = {a, b};
  size_t sizes[2] = {16, 16};
  int tags[2] = {1, 2};
  void* req = NULL;
  assert_int_equal(agoq_net_irecv(p.recv, 2, bufs, sizes, tags, NULL, NULL, &req), ncclInvalidUsage);
  assert_null(req);
  pair_close(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_posted_receives_match_by_tag),
      cmocka_unit_test(test_early_messages_are_held),
      cmocka_unit_test(test_any_takes_the_oldest),
      cmocka_unit_test(test_held_messages_are_bounded),
      cmocka_unit_test(test_truncation_is_an_error),
      cmocka_unit_test(test_grouped_receive_refused),
  };
  return cmocka_run_group_tests(tests, setup_env, NULL);
}
