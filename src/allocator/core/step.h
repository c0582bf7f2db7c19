/* The step tracker (step.c): finds the period of a program whose steps repeat, from the default pool's
 * mallocs and completed frees alone, and then follows that period event by event, so that the plan
 * (expandable/plan.c) knows which of the period's mallocs each new malloc is. No call from the user: a
 * training loop repeats its allocations step after step, and that is all it needs.
 *
 * An event is a malloc, keyed by (rounded size, stream), or a free completing, keyed by how many events
 * ago its block was handed out: the same sizes freed in another order are another stream of events.
 * A candidate period d comes from the last occurrences of the last W events (a chain of them, so that a
 * layer's pattern repeating inside a step does not hide the step); it is taken once d events in a row
 * equal the events d before them and the tracked bytes live are the same at both ends (a layer that
 * leaves its activations live is no period). All of it runs in exclusive mode. */
#ifndef CACHALOT_ALLOCATOR_STEP_H
#define CACHALOT_ALLOCATOR_STEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cachalot/backend.h"

enum {
  CL_STEP_RING = 1u << 15,    /* events remembered: a period of up to (RING - W) / 2 events is found */
  CL_STEP_W = 16,             /* events a candidate starts from */
  CL_STEP_CANDIDATES = 8,     /* periods tried at once */
  CL_STEP_CHAIN = 64,         /* earlier occurrences of the last W events looked at, per event */
  CL_STEP_MAX_PERIOD = (CL_STEP_RING - CL_STEP_W) / 2,
  /* shorter repeats (a layer's pattern, a loop of a few tensors) are left to the online policy, which
   * leaves no holes in them anyway; and on the traces they are parts of steps that do not repeat */
  CL_STEP_MIN_PERIOD = 64,
};

/* One event. For a malloc, `life` is the events from it to its block's free completing (0 while live). */
typedef struct {
  uint64_t sym;    /* what must repeat (see above) */
  int64_t live;    /* the tracked bytes live after it */
  size_t size;     /* a malloc's rounded size; 0 for a free */
  cachalot_stream stream;
  uint64_t life;
  uint64_t prev;   /* 1 + the latest earlier event ending the same W events (0: none known) */
} cl_step_event;

/* The tracker. Invariants: event i (i < n) is ring[i % CL_STEP_RING] while n - i <= CL_STEP_RING;
 * `live` is the sum of the sizes of the tracked blocks handed out and not freed; while `period` is 0 no
 * plan is followed, and once it is set, `sym` holds the period's events from position 0 (the event
 * start) and `pos` is where the next event is expected while `synced`. */
typedef struct cl_step {
  uint64_t n;
  int64_t live;
  cl_step_event *ring;
  struct cl_step_gram { uint64_t hash, at1; } *grams; /* W events' hash -> 1 + the latest event ending them */
  size_t grams_mask;
  struct cl_step_cand { uint64_t d, run; } cand[CL_STEP_CANDIDATES];
  size_t n_cand;
  /* the period found, its first event, and following it */
  uint64_t period, start;
  uint64_t *sym;                   /* [period] */
  struct cl_step_gram *pgrams;     /* W events' hash -> 1 + the period position ending them */
  size_t pgrams_mask;
  uint64_t pos, lap;
  bool synced;
  uint64_t lost;                   /* events since the last malloc that matched */
  uint64_t lost_since;             /* times the period was lost while followed */
  uint64_t matched;                /* events matched in a row: positions are given from a whole period on */
  uint64_t found;                  /* periods found so far */
  /* the program's latest restart (everything freed and made again, expandable/plan.c): compaction then
   * keeps below the reserved peak since it (`peak`, kept by growth) where `restarted`, else below the
   * reserved bytes' peak */
  uint64_t restarted_at;           /* the event count at it */
  bool restarted;                  /* whether it had no plan */
  int64_t peak;
} cl_step;

/* A new tracker (NULL on host OOM), and its end. */
cl_step *cl_step_new(void);
void cl_step_delete(cl_step *st);

/* Records a malloc of `size` rounded bytes on `stream`, handed a block of `held` bytes (the rest of a
 * block too small to split goes with it); returns the number to keep in the block (its event + 1). */
uint64_t cl_step_malloc(cl_step *st, size_t size, size_t held, cachalot_stream stream);
/* Whether the next event, a malloc of `size` rounded bytes on `stream`, is the followed period's expected
 * one; its position in the period and its lap then (the lap's parity picks one of the plan's two places). */
bool cl_step_position(const cl_step *st, size_t size, cachalot_stream stream, uint64_t *pos, uint64_t *lap);
/* Whether the tracker follows its period now, so that it gives positions: synced, and a whole period
 * matched since the last loss. */
static inline bool cl_step_following(const cl_step *st) {
  return st->sym && st->synced && st->matched >= st->period;
}
/* Records the free of the block of `held` bytes that cl_step_malloc numbered `seq` completing. */
void cl_step_free(cl_step *st, uint64_t seq, size_t size);
/* Whether a period was found by the last event and is not yet followed: the caller plans from
 * cl_step_window and then calls cl_step_follow (or cl_step_forget when it cannot plan). */
bool cl_step_found(const cl_step *st);
/* The event of the last period found at position k (0 <= k < period), and the life of its block where
 * known: its own, else the same position's one period before (false when neither is known: the block
 * outlives what the tracker can see). */
const cl_step_event *cl_step_window(const cl_step *st, uint64_t k);
bool cl_step_life(const cl_step *st, uint64_t k, uint64_t *life);
/* Starts following the period found (false on host OOM: nothing changes then but the period is dropped). */
bool cl_step_follow(cl_step *st);
/* Drops the period (followed or not): detection starts over. */
void cl_step_forget(cl_step *st);
/* Whether a followed period has had no malloc of its own for two whole periods of events: the plan should
 * go. (One period is too short: a deviation as long as a step, an evaluation step, would drop a plan that
 * the program comes back to.) */
static inline bool cl_step_gone(const cl_step *st) { return st->sym && st->lost > 2 * st->period + CL_STEP_W; }

#endif
