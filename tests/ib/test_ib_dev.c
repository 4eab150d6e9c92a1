/* The verbs transport's per-device state over the emulator.
 * Registrations (agoq_ib_mr.c): one region per range however many hold it, whole pages,
 * references, the last one deregistering, the transport's reg/dereg keys, a transfer's key
 * checked against its buffer, leftovers at unload, a failed registration reported.
 * Asynchronous events (agoq_ib_async.c): a port going down and back, a catastrophic device
 * error failing the connections with work in flight, other events only logged. */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/agoq_log.h"
#include "core/agoq_params.h"
#include "transport/ib/agoq_ib.h"

static int count_mrs(const agoq_ib_dev* d) {
  int n = 0;
  for (const agoq_ib_mr* m = d->mrs; m != NULL; m = m->next) n++;
  return n;
}

static int setup(void** state) {
  (void)state;
  setenv("AGOQ_IB_LIBRARY", AGOQ_IBV_EMU_PATH, 1);
  agoq_params_reset();
  if (agoq_params_load() != ncclSuccess) return -1;
  char why[256];
  if (agoq_ib_discover(&agoq_ib, NULL, NULL, why, sizeof why) != ncclSuccess) {
    fprintf(stderr, "discover: %s\n", why);
    return -1;
  }
  return agoq_ib.ndevs > 0 ? 0 : -1;
}

static int teardown(void** state) {
  (void)state;
  agoq_ib_release(&agoq_ib);
  return 0;
}

static uint8_t* pages(size_t n) {
  long page = sysconf(_SC_PAGESIZE);
  void* p = NULL;
  assert_int_equal(posix_memalign(&p, (size_t)page, n * (size_t)page), 0);
  return p;
}

static void shared_and_counted(void** state) {
  (void)state;
  agoq_ib_dev* d = &agoq_ib.devs[0];
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint8_t* buf = pages(4);
  uint64_t made0 = d->mr_made, shared0 = d->mr_shared;
  agoq_ib_mr *a = NULL, *b = NULL, *c = NULL;
  bool made = false;
  /* an unaligned range inside page 1: the region is pages 1..2 */
  assert_int_equal(agoq_ib_mr_get(d, buf + page + 100, page, &a, &made), ncclSuccess);
  assert_true(made);
  assert_int_equal(a->start, (uintptr_t)(buf + page));
  assert_int_equal(a->end, (uintptr_t)(buf + 3 * page));
  assert_true(agoq_ib_mr_covers(a, buf + page, 2 * page));
  assert_false(agoq_ib_mr_covers(a, buf + page, 2 * page + 1));
  assert_false(agoq_ib_mr_covers(a, buf + page - 1, 1));
  /* a range inside it takes a reference: no second region */
  assert_int_equal(agoq_ib_mr_get(d, buf + 2 * page, 10, &b, &made), ncclSuccess);
  assert_false(made);
  assert_ptr_equal(a, b);
  assert_int_equal(a->refs, 2);
  /* one reaching past it is a region of its own */
  assert_int_equal(agoq_ib_mr_get(d, buf + 2 * page, 2 * page, &c, &made), ncclSuccess);
  assert_true(made);
  assert_ptr_not_equal(c, a);
  assert_int_equal(count_mrs(d), 2);
  assert_int_equal(d->mr_made - made0, 2);
  assert_int_equal(d->mr_shared - shared0, 1);
  /* the last reference deregisters */
  agoq_ib_mr_put(b);
  assert_int_equal(count_mrs(d), 2);
  agoq_ib_mr_put(a);
  assert_int_equal(count_mrs(d), 1);
  agoq_ib_mr_put(c);
  assert_int_equal(count_mrs(d), 0);
  free(buf);
}

static void keys_and_transfers(void** state) {
  (void)state;
  agoq_ib_dev* d = &agoq_ib.devs[0];
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint8_t* buf = pages(2);
  void* key = NULL;
  assert_int_equal(agoq_ib_reg_key(0, buf, 2 * page, &key), ncclSuccess);
  assert_non_null(key);
  void* bad = NULL;
  assert_int_equal(agoq_ib_reg_key(agoq_ib.ndevs, buf, page, &bad), ncclInternalError);
  assert_null(bad);
  /* a transfer inside the key uses it; one outside takes a region for the message */
  agoq_ib_conn conn;
  memset(&conn, 0, sizeof conn);
  conn.d = d;
  snprintf(conn.peer, sizeof conn.peer, "test peer");
  /* a transfer inside the key uses the reference taken at post */
  agoq_ib_mr* m = NULL;
  agoq_ib_mr* held = agoq_ib_mr_ref(key);
  assert_ptr_equal(held, key);
  assert_int_equal(held->refs, 2);
  assert_int_equal(agoq_ib_mr_for(&conn, held, buf + 8, page, &m), ncclSuccess);
  assert_ptr_equal(m, key);
  /* the caller deregisters while the transfer is in flight: the region stays */
  agoq_ib_dereg_key(key);
  assert_int_equal(count_mrs(d), 1);
  assert_int_equal(m->refs, 1);
  agoq_ib_mr_put(m);
  assert_int_equal(count_mrs(d), 0);
  assert_null(agoq_ib_mr_ref(NULL));
  /* one outside the key: the reference is dropped, a region is made for the message */
  assert_int_equal(agoq_ib_reg_key(0, buf, 2 * page, &key), ncclSuccess);
  uint8_t* other = pages(1);
  assert_int_equal(agoq_ib_mr_for(&conn, agoq_ib_mr_ref(key), other, 64, &m), ncclSuccess);
  assert_ptr_not_equal(m, key);
  assert_int_equal(conn.transient_regs, 1);
  assert_int_equal(((agoq_ib_mr*)key)->refs, 1);
  agoq_ib_mr_put(m);
  /* no key, but a live region covers it: a reference, not a registration */
  assert_int_equal(agoq_ib_mr_for(&conn, NULL, buf + page, 16, &m), ncclSuccess);
  assert_ptr_equal(m, key);
  assert_int_equal(conn.transient_regs, 1);
  agoq_ib_mr_put(m);
  agoq_ib_dereg_key(key);
  assert_int_equal(count_mrs(d), 0);
  agoq_ib_dereg_key(NULL);
  free(other);
  free(buf);
}

static void failure_fails_the_connection(void** state) {
  (void)state;
  agoq_ib_dev* d = &agoq_ib.devs[0];
  uint8_t* buf = pages(1);
  setenv("AGOQ_IBV_EMU_FAULT", "reg_mr_enomem", 1);
  agoq_ib_conn conn;
  memset(&conn, 0, sizeof conn);
  conn.d = d;
  agoq_ib_mr* m = NULL;
  /* the emulator applies its fault variable at its next entry point */
  struct agoq_ibv_device** list = agoq_ib.api.get_device_list(NULL);
  agoq_ib.api.free_device_list(list);
  assert_int_equal(agoq_ib_mr_for(&conn, NULL, buf, 64, &m), ncclSystemError);
  assert_null(m);
  assert_int_equal(atomic_load(&conn.error), ncclSystemError);
  void* key = NULL;
  assert_int_equal(agoq_ib_reg_key(0, buf, 64, &key), ncclSystemError);
  assert_null(key);
  assert_int_equal(count_mrs(d), 0);
  setenv("AGOQ_IBV_EMU_FAULT", "", 1);
  list = agoq_ib.api.get_device_list(NULL);
  agoq_ib.api.free_device_list(list);
  free(buf);
}

static void leftovers_released_at_unload(void** state) {
  (void)state;
  agoq_ib_dev* d = &agoq_ib.devs[0];
  uint8_t* buf = pages(3);
  void* k1 = NULL;
  void* k2 = NULL;
  assert_int_equal(agoq_ib_reg_key(0, buf, 64, &k1), ncclSuccess);
  assert_int_equal(agoq_ib_reg_key(0, buf + 2 * sysconf(_SC_PAGESIZE), 64, &k2), ncclSuccess);
  assert_int_equal(count_mrs(d), 2);
  agoq_ib_mr_release_dev(&agoq_ib, d);
  assert_int_equal(count_mrs(d), 0);
  free(buf);
}

/* ---- asynchronous events ------------------------------------------------------------------ */

typedef int (*port_set_fn)(struct agoq_ibv_context*, uint8_t, int);
typedef int (*device_event_fn)(struct agoq_ibv_context*, int, uint8_t);

static void* emu_control(const char* name) {
  void* f = dlvsym(agoq_ib.api.handle, name, "AGOQ_IBV_EMU_1");
  assert_non_null(f);
  return f;
}

static void port_down_and_back(void** state) {
  (void)state;
  agoq_ib_dev* d = &agoq_ib.devs[0];
  port_set_fn port_set = (port_set_fn)emu_control("agoq_ibv_emu_port_set_state");
  assert_int_equal(agoq_ib_async_drain(&agoq_ib), 0); /* nothing queued: never blocks */
  assert_int_equal(port_set(d->ctx, (uint8_t)d->port, AGOQ_IBV_PORT_DOWN), 0);
  assert_int_equal(agoq_ib_async_drain(&agoq_ib), 1);
  assert_int_equal(atomic_load(&d->port_down), 1);
  assert_true(d->port_down_ms > 0);
  assert_int_equal(agoq_ib_async_drain(&agoq_ib), 0);
  assert_int_equal(port_set(d->ctx, (uint8_t)d->port, AGOQ_IBV_PORT_ACTIVE), 0);
  assert_int_equal(agoq_ib_async_drain(&agoq_ib), 1);
  assert_int_equal(atomic_load(&d->port_down), 0);
}

static void device_fatal_fails_connections(void** state) {
  (void)state;
  agoq_ib_dev* d = &agoq_ib.devs[0];
  device_event_fn event = (device_event_fn)emu_control("agoq_ibv_emu_device_event");
  /* a GID table change is logged and changes nothing */
  assert_int_equal(event(d->ctx, AGOQ_IBV_EVENT_GID_CHANGE, (uint8_t)d->port), 0);
  assert_int_equal(agoq_ib_async_drain(&agoq_ib), 1);
  assert_int_equal(atomic_load(&d->fatal), 0);
  assert_int_equal(event(d->ctx, AGOQ_IBV_EVENT_PORT_ERR, 0), EINVAL); /* not a device event */
  /* a connection with work in flight on a device that had a catastrophic error fails at
   * its next poll, without waiting for a completion that may never come */
  agoq_ib_conn conn;
  memset(&conn, 0, sizeof conn);
  conn.d = d;
  conn.fifo_count = 1;
  snprintf(conn.peer, sizeof conn.peer, "test peer");
  assert_int_equal(event(d->ctx, AGOQ_IBV_EVENT_DEVICE_FATAL, 0), 0);
  assert_int_equal(agoq_ib_async_drain(&agoq_ib), 1);
  assert_int_equal(atomic_load(&d->fatal), 1);
  assert_false(agoq_ib_conn_poll(&conn, false));
  assert_int_equal(atomic_load(&conn.error), ncclSystemError);
  atomic_store(&d->fatal, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(port_down_and_back),
      cmocka_unit_test(device_fatal_fails_connections),
      cmocka_unit_test(shared_and_counted),
      cmocka_unit_test(keys_and_transfers),
      cmocka_unit_test(failure_fails_the_connection),
      cmocka_unit_test(leftovers_released_at_unload),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
