/* The progress helper: one thread per process that polls the completion queues of the
 * connections with transfers in flight, so that a connection whose owner is busy elsewhere
 * (NCCL's proxy waiting on another request, a caller testing requests one at a time) still
 * answers: a sender writes its payload as soon as the receiver's "write here" arrives, a
 * receiver counts the stripes that landed. Matching stays on the owner's thread (it calls
 * into the net core); the helper never calls out of the transport. Each connection's state
 * is under its mutex; the helper only try-locks it, so an owner is never held up. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "core/agoq_check.h"
#include "transport/ib/agoq_ib.h"

#define AGOQ_IB_HELPER_BUSY_NS 20000     /* between sweeps while transfers are in flight */
#define AGOQ_IB_HELPER_IDLE_NS 1000000   /* between looks while nothing is */
/* Busy sweeps between looks at the devices' asynchronous events (about a millisecond). */
#define AGOQ_IB_HELPER_EVENTS_EVERY 64

static struct {
  pthread_mutex_t mu;
  pthread_t thread;
  bool running;
  bool stop;
  agoq_ib_conn* conns;
} agoq_ib_helper = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void agoq_ib_sleep_ns(long ns) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = ns};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void* agoq_ib_helper_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&agoq_ib_helper.mu);
  unsigned sweeps = 0;
  while (!agoq_ib_helper.stop) {
    bool busy = false;
    /* Port and device events explain the completion errors that follow them. */
    if (sweeps++ % AGOQ_IB_HELPER_EVENTS_EVERY == 0) agoq_ib_async_drain(&agoq_ib);
    for (agoq_ib_conn* c = agoq_ib_helper.conns; c != NULL; c = c->helper_next) {
      if (pthread_mutex_trylock(&c->mu) != 0) {
        busy = true; /* its owner is moving it */
        continue;
      }
      busy |= agoq_ib_conn_poll(c, false);
      pthread_mutex_unlock(&c->mu);
    }
    if (!busy) sweeps = 0; /* idle: look at the events at every tick */
    pthread_mutex_unlock(&agoq_ib_helper.mu);
    agoq_ib_sleep_ns(busy ? AGOQ_IB_HELPER_BUSY_NS : AGOQ_IB_HELPER_IDLE_NS);
    pthread_mutex_lock(&agoq_ib_helper.mu);
  }
  pthread_mutex_unlock(&agoq_ib_helper.mu);
  return NULL;
}

void agoq_ib_helper_attach(agoq_ib_conn* c) {
  pthread_mutex_lock(&agoq_ib_helper.mu);
  c->helper_next = agoq_ib_helper.conns;
  agoq_ib_helper.conns = c;
  if (!agoq_ib_helper.running) {
    agoq_ib_helper.stop = false;
    int rc = pthread_create(&agoq_ib_helper.thread, NULL, agoq_ib_helper_main, NULL);
    if (rc == 0) {
      agoq_ib_helper.running = true;
      AGOQ_INFO(NCCL_INIT | NCCL_NET, "started the verbs progress helper thread");
    } else {
      /* Still correct: then only the owners' calls move their connections. */
      AGOQ_WARN("cannot start the verbs progress helper thread: %s; connections move only when tested",
                strerror(rc));
    }
  }
  pthread_mutex_unlock(&agoq_ib_helper.mu);
}

void agoq_ib_helper_detach(agoq_ib_conn* c) {
  pthread_mutex_lock(&agoq_ib_helper.mu);
  for (agoq_ib_conn** pp = &agoq_ib_helper.conns; *pp != NULL; pp = &(*pp)->helper_next) {
    if (*pp == c) {
      *pp = c->helper_next;
      break;
    }
  }
  pthread_mutex_unlock(&agoq_ib_helper.mu);
}

int agoq_ib_helper_threads(void) {
  pthread_mutex_lock(&agoq_ib_helper.mu);
  int n = agoq_ib_helper.running ? 1 : 0;
  pthread_mutex_unlock(&agoq_ib_helper.mu);
  return n;
}

static void agoq_ib_helper_stop(bool only_when_idle) {
  pthread_mutex_lock(&agoq_ib_helper.mu);
  bool join = agoq_ib_helper.running && (!only_when_idle || agoq_ib_helper.conns == NULL);
  if (join) agoq_ib_helper.stop = true;
  pthread_mutex_unlock(&agoq_ib_helper.mu);
  if (!join) return;
  pthread_join(agoq_ib_helper.thread, NULL);
  pthread_mutex_lock(&agoq_ib_helper.mu);
  agoq_ib_helper.running = false;
  pthread_mutex_unlock(&agoq_ib_helper.mu);
}

void agoq_ib_helper_stop_when_idle(void) { agoq_ib_helper_stop(true); }
void agoq_ib_helper_shutdown(void) { agoq_ib_helper_stop(false); }
