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

static void* post_spill(pair* p, uint8_t* data, size_t n, size_t max, int tag) {
  void* req = NULL;
  assert_int_equal(agoq_net_irecv_spill(p->recv, data, n, max, tag, &req), ncclSuccess);
  assert_non_null(req);
  return req;
}

/* Tests a spilling receive until done: its size, and *spill as test gave it. */
static int wait_spill(void* req, uint8_t** spill) {
  int done = 0, size = -1;
  double deadline = now_s() + 30;
  while (!done && now_s() < deadline) assert_int_equal(agoq_net_test_spill(req, &done, &size, spill), ncclSuccess);
  assert_true(done);
  return size;
}

/* A spilling receive (agoq_net_irecv_spill) whose buffer is smaller than the message: the
 * message, up to the maximum, comes in a buffer of its own, whether the receive was posted
 * first or the message was held; the receive's buffer is untouched. A message that fits
 * goes into the buffer, with no spill. */
static void test_spill_takes_larger_messages(void** state) {
  (void)state;
  pair p;
  tagged_open(&p);
  enum { SMALL = MSG / 4 };
  static uint8_t small[3][SMALL], out[3][MSG];
  memset(small, 0xee, sizeof small);
  /* Posted first: tag 1, then held: tag 2 (tag 3 sent after it says it is in). */
  void* first = post_spill(&p, small[0], SMALL, MSG, 1);
  int tags[3] = {1, 2, 3};
  send_all(&p, out, tags, 3);
  uint8_t* spill = NULL;
  assert_int_equal(wait_spill(first, &spill), MSG);
  assert_non_null(spill);
  check(spill, 1);
  free(spill);
  assert_int_equal(wait_done(post_recv(&p, out[2], MSG, 3)), MSG);
  assert_int_equal(wait_spill(post_spill(&p, small[1], SMALL, MSG, 2), &spill), MSG);
  assert_non_null(spill);
  check(spill, 2);
  free(spill);
  for (size_t i = 0; i < SMALL; i++) assert_int_equal(small[0][i] & small[1][i], 0xee);
  /* A message that fits its buffer lands there. */
  uint8_t fits[SMALL];
  fill(fits, SMALL, 4);
  void* r = post_spill(&p, small[2], SMALL, MSG, 4);
  assert_int_equal(wait_done(post_send(&p, fits, SMALL, 4)), SMALL);
  spill = (uint8_t*)&spill;
  assert_int_equal(wait_spill(r, &spill), SMALL);
  assert_null(spill);
  assert_memory_equal(small[2], fits, SMALL);
  pair_close(&p);
}

/* Past the spill maximum is truncation, as for any receive; a spilled message its caller
 * does not take (plain test) is freed with the request (ASan's leak check). */
static void test_spill_maximum_is_enforced(void** state) {
  (void)state;
  pair p;
  tagged_open(&p);
  static uint8_t small[64], out[2][MSG];
  int tags[2] = {7, 8};
  void* untaken = post_spill(&p, small, sizeof small, MSG, 8);
  send_all(&p, out, tags, 2);
  /* Once tag 8 (sent second) is in, tag 7's message is held. */
  assert_int_equal(wait_done(untaken), MSG);
  void* req = NULL;
  assert_int_equal(agoq_net_irecv_spill(p.recv, small, sizeof small, MSG - 1, 7, &req), ncclInvalidUsage);
  assert_null(req);
  pair_close(&p);
  /* Posted first, too small a maximum: test fails it. */
  tagged_open(&p);
  req = post_spill(&p, small, sizeof small, MSG - 1, 9);
  (void)post_send(&p, out[0], MSG, 9);
  int done = 0, size = -1;
  uint8_t* spill = NULL;
  ncclResult_t res = ncclSuccess;
  double deadline = now_s() + 30;
  while (res == ncclSuccess && !done && now_s() < deadline) res = agoq_net_test_spill(req, &done, &size, &spill);
  assert_false(done);
  assert_int_equal(res, ncclInvalidUsage);
  assert_null(spill);
  /* A maximum below the buffer is a caller's error. */
  assert_int_equal(agoq_net_irecv_spill(p.recv, small, sizeof small, 8, 10, &req), ncclInternalError);
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
      cmocka_unit_test(test_spill_takes_larger_messages),
      cmocka_unit_test(test_spill_maximum_is_enforced),
  };
  return cmocka_run_group_tests(tests, setup_env, NULL);
}
