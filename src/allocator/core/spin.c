/* The spin lock's waiting (lanes.h keeps its uncontended path inline), below every file that takes one. */
#include "lanes.h"

#include <sched.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

void cl_backoff(unsigned round) {
  if (round < 128) {
    cpu_relax();
  } else if (round < 1024) {
    sched_yield();
  } else {
    /* The holder may be in exclusive mode across a device call (release_lock_on_cudamalloc:False). */
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
  }
}

void cl_spin_lock_slow(cl_spin *l) {
  for (unsigned round = 0;; round++) {
    if (!atomic_load_explicit(&l->held, memory_order_relaxed) &&
        !atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
      return;
    cl_backoff(round);
  }
}
