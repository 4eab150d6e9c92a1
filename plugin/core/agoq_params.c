#include "core/agoq_params.h"

#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/agoq_log.h"

/* The longest text kept for display of any type. */
#define AGOQ_PARAM_TEXT_MAX AGOQ_PARAM_STRING_MAX
/* How much of a bad value an error message quotes: enough to recognise it, short enough
 * that a pasted blob does not drown the line. */
#define AGOQ_PARAM_QUOTE_MAX 64

static const agoq_param_desc agoq_param_table[AGOQ_PARAM_COUNT] = {
#define AGOQ_PARAM(id, type, def, min, max, choices, fallback, doc)                            \
  [AGOQ_PARAM_##id] = {"AGOQ_" #id, AGOQ_PARAM_TYPE_##type, (def), (int64_t)(min), (int64_t)(max), \
                       (choices), (fallback), (doc)},
#include "core/agoq_params.def"
#undef AGOQ_PARAM
};

typedef struct {
  int64_t value;
  char text[AGOQ_PARAM_TEXT_MAX + 1];
  const char* source;
} agoq_param_value;

static pthread_mutex_t agoq_params_mutex = PTHREAD_MUTEX_INITIALIZER;
/* Set (release) after values and result are written, so readers that see it loaded
 * may read them without the mutex. */
static atomic_bool agoq_params_loaded = false;
static ncclResult_t agoq_params_result = ncclSuccess;
static agoq_param_value agoq_param_values[AGOQ_PARAM_COUNT];
/* Bumped by every reset, so that what was derived from the values knows to derive again. */
static atomic_uint agoq_params_gen;

unsigned agoq_params_generation(void) { return atomic_load(&agoq_params_gen); }

extern char** environ;

/* Names outside the table that agoq, its tools or its tests read (agoq_env_other.def); a
 * row ending in '*' covers every name with that prefix. */
static const char* const agoq_env_known_other[] = {
#define AGOQ_ENV_OTHER(NAME, READ_BY, DOC) NAME,
#include "core/agoq_env_other.def"
#undef AGOQ_ENV_OTHER
};

const agoq_param_desc* agoq_param_describe(agoq_param_id id) {
  if ((int)id < 0 || id >= AGOQ_PARAM_COUNT) return NULL;
  return &agoq_param_table[id];
}

const char* agoq_param_type_name(agoq_param_type type) {
  switch (type) {
    case AGOQ_PARAM_TYPE_INT: return "int";
    case AGOQ_PARAM_TYPE_SIZE: return "size";
    case AGOQ_PARAM_TYPE_BOOL: return "bool";
    case AGOQ_PARAM_TYPE_STRING: return "string";
    case AGOQ_PARAM_TYPE_ENUM: return "enum";
  }
  return "?";
}

/* ---- Parsing ------------------------------------------------------------------------- */

/* [*begin, *end) without surrounding whitespace. */
static void agoq_param_trim(const char* text, const char** begin, const char** end) {
  const char* b = text;
  const char* e = text + strlen(text);
  while (b < e && isspace((unsigned char)*b)) b++;
  while (e > b && isspace((unsigned char)e[-1])) e--;
  *begin = b;
  *end = e;
}

/* The value as it may appear in a message: truncated, control characters shown as '?',
 * so a hostile or binary value cannot break the log line. */
static void agoq_param_quote(const char* text, char* out, size_t outlen) {
  size_t n = 0;
  size_t i = 0;
  for (; text[i] != '\0' && i < AGOQ_PARAM_QUOTE_MAX && n + 1 < outlen; i++)
    out[n++] = isprint((unsigned char)text[i]) ? text[i] : '?';
  out[n] = '\0';
  if (text[i] != '\0' && n + 4 <= outlen) memcpy(out + n, "...", 4);
}

/* True when [b, e) equals word, ignoring case. */
static bool agoq_param_word_eq(const char* b, const char* e, const char* word, size_t wordlen) {
  return (size_t)(e - b) == wordlen && strncasecmp(b, word, wordlen) == 0;
}

/* Decimal digits only into an unsigned magnitude; false on no digits or overflow of
 * limit. *p ends at the first non-digit. */
static bool agoq_param_digits(const char** p, const char* e, uint64_t limit, uint64_t* out) {
  const char* s = *p;
  uint64_t v = 0;
  if (s == e || !isdigit((unsigned char)*s)) return false;
  for (; s < e && isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (limit - d) / 10) return false;
    v = v * 10 + d;
  }
  *p = s;
  *out = v;
  return true;
}

static bool agoq_param_parse_int(const char* b, const char* e, int64_t* out) {
  bool neg = false;
  if (b < e && (*b == '+' || *b == '-')) {
    neg = *b == '-';
    b++;
  }
  uint64_t mag;
  /* One more on the negative side: INT64_MIN has no positive twin. */
  uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  if (!agoq_param_digits(&b, e, limit, &mag) || b != e) return false;
  if (neg)
    *out = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
  else
    *out = (int64_t)mag;
  return true;
}

static bool agoq_param_parse_size(const char* b, const char* e, int64_t* out) {
  uint64_t mag;
  if (!agoq_param_digits(&b, e, (uint64_t)INT64_MAX, &mag)) return false;
  unsigned shift = 0;
  if (b < e) {
    switch (toupper((unsigned char)*b)) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: break;
    }
    if (shift != 0) b++;
  }
  /* "64K", "64KB", "64KiB" and "4096B" are all bytes; "4096iB" is not a unit. */
  if (shift != 0 && agoq_param_word_eq(b, e, "iB", 2))
    b += 2;
  else if (agoq_param_word_eq(b, e, "B", 1))
    b += 1;
  if (b != e) return false;
  if (mag > ((uint64_t)INT64_MAX >> shift)) return false;
  *out = (int64_t)(mag << shift);
  return true;
}

static bool agoq_param_parse_bool(const char* b, const char* e, int64_t* out) {
  static const char* const agoq_true[] = {"1", "true", "yes", "on"};
  static const char* const agoq_false[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < sizeof agoq_true / sizeof agoq_true[0]; i++) {
    if (agoq_param_word_eq(b, e, agoq_true[i], strlen(agoq_true[i]))) {
      *out = 1;
      return true;
    }
    if (agoq_param_word_eq(b, e, agoq_false[i], strlen(agoq_false[i]))) {
      *out = 0;
      return true;
    }
  }
  return false;
}

static bool agoq_param_parse_enum(const char* choices, const char* b, const char* e,
                                  int64_t* out) {
  if (choices == NULL || b == e) return false;
  int64_t index = 0;
  for (const char* c = choices;; index++) {
    const char* bar = strchr(c, '|');
    size_t len = bar != NULL ? (size_t)(bar - c) : strlen(c);
    if (agoq_param_word_eq(b, e, c, len)) {
      *out = index;
      return true;
    }
    if (bar == NULL) return false;
    c = bar + 1;
  }
}

/* The clause after "expected": what this parameter accepts. */
static void agoq_param_expected(const agoq_param_desc* desc, char* out, size_t outlen) {
  switch (desc->type) {
    case AGOQ_PARAM_TYPE_INT:
      snprintf(out, outlen, "an integer in [%" PRId64 ", %" PRId64 "]", desc->min, desc->max);
      break;
    case AGOQ_PARAM_TYPE_SIZE:
      snprintf(out, outlen,
               "a size in bytes in [%" PRId64 ", %" PRId64 "], optionally with a K/M/G/T suffix "
               "(powers of 1024: 64K = 64KB = 64KiB = 65536)%s%s",
               desc->min, desc->max, desc->choices != NULL ? ", or " : "",
               desc->choices != NULL ? desc->choices : "");
      break;
    case AGOQ_PARAM_TYPE_BOOL:
      snprintf(out, outlen, "a boolean: 0/1, true/false, yes/no or on/off");
      break;
    case AGOQ_PARAM_TYPE_ENUM:
      snprintf(out, outlen, "one of %s", desc->choices != NULL ? desc->choices : "(none)");
      break;
    case AGOQ_PARAM_TYPE_STRING:
      snprintf(out, outlen, "at most %d characters", AGOQ_PARAM_TEXT_MAX);
      break;
  }
}

ncclResult_t agoq_param_parse(const agoq_param_desc* desc, const char* text, int64_t* value,
                              char* err, size_t errlen) {
  if (err != NULL && errlen > 0) err[0] = '\0';
  if (desc == NULL || text == NULL || value == NULL) {
    if (err != NULL && errlen > 0) snprintf(err, errlen, "agoq_param_parse: NULL argument");
    return ncclInternalError;
  }
  const char *b, *e;
  agoq_param_trim(text, &b, &e);
  int64_t v = 0;
  bool ok = false;
  switch (desc->type) {
    case AGOQ_PARAM_TYPE_INT:
      ok = agoq_param_parse_int(b, e, &v) && v >= desc->min && v <= desc->max;
      break;
    case AGOQ_PARAM_TYPE_SIZE:
      ok = agoq_param_parse_size(b, e, &v) && v >= desc->min && v <= desc->max;
      /* A size may also be one of its keywords (choices): the k-th is the value -(k + 1). */
      if (!ok && agoq_param_parse_enum(desc->choices, b, e, &v)) {
        v = -(v + 1);
        ok = true;
      }
      break;
    case AGOQ_PARAM_TYPE_BOOL:
      ok = agoq_param_parse_bool(b, e, &v);
      break;
    case AGOQ_PARAM_TYPE_ENUM:
      ok = agoq_param_parse_enum(desc->choices, b, e, &v);
      break;
    case AGOQ_PARAM_TYPE_STRING:
      ok = e - b <= AGOQ_PARAM_TEXT_MAX;
      v = 0;
      break;
  }
  if (ok) {
    *value = v;
    return ncclSuccess;
  }
  if (err != NULL && errlen > 0) {
    char quoted[AGOQ_PARAM_QUOTE_MAX + 4];
    char expected[160];
    agoq_param_quote(text, quoted, sizeof quoted);
    agoq_param_expected(desc, expected, sizeof expected);
    snprintf(err, errlen, "%s=\"%s\": expected %s", desc->name, quoted, expected);
  }
  return ncclInvalidUsage;
}

/* ---- Loading ------------------------------------------------------------------------- */

/* The variable's value, or NULL when unset; empty or blank counts as unset, the way a
 * job script's `export AGOQ_X=` means "no opinion". */
static const char* agoq_param_getenv(const char* name) {
  if (name == NULL) return NULL;
  const char* v = getenv(name);
  if (v == NULL) return NULL;
  const char *b, *e;
  agoq_param_trim(v, &b, &e);
  return b == e ? NULL : v;
}

static void agoq_param_store_text(agoq_param_value* slot, const char* text) {
  const char *b, *e;
  agoq_param_trim(text, &b, &e);
  size_t len = (size_t)(e - b);
  if (len > AGOQ_PARAM_TEXT_MAX) len = AGOQ_PARAM_TEXT_MAX;
  memcpy(slot->text, b, len);
  slot->text[len] = '\0';
}

/* One parameter: default first (a broken default is our bug, not the user's), then the
 * environment over it. An invalid value leaves the default's number in place but
 * records the offending text and variable, so `agoq-info -c` can show what was wrong. */
static ncclResult_t agoq_param_load_one(agoq_param_id id) {
  const agoq_param_desc* desc = &agoq_param_table[id];
  agoq_param_value* slot = &agoq_param_values[id];
  char err[512];
  agoq_param_store_text(slot, desc->default_value);
  slot->source = "default";
  if (agoq_param_parse(desc, desc->default_value, &slot->value, err, sizeof err) != ncclSuccess) {
    AGOQ_WARN("internal error: default of %s is invalid: %s", desc->name, err);
    return ncclInternalError;
  }

  const char* var = desc->name;
  const char* text = agoq_param_getenv(var);
  if (text == NULL) {
    var = desc->nccl_fallback;
    text = agoq_param_getenv(var);
  }
  if (text == NULL) return ncclSuccess;

  agoq_param_store_text(slot, text);
  slot->source = var;
  /* The message names the variable the user actually set, which may be NCCL's. */
  agoq_param_desc named = *desc;
  named.name = var;
  int64_t value;
  if (agoq_param_parse(&named, text, &value, err, sizeof err) != ncclSuccess) {
    AGOQ_WARN("%s", err);
    return ncclInvalidUsage;
  }
  slot->value = value;
  AGOQ_INFO(NCCL_ENV, "%s set by environment to %s.", var, slot->text);
  return ncclSuccess;
}

/* ---- Unknown names ------------------------------------------------------------------- */

/* Edit distance with adjacent transpositions (optimal string alignment): "FOMRAT" is one
 * step from "FORMAT", as a typist would count it. Names are short (< 64). */
static int agoq_param_distance(const char* a, size_t la, const char* b, size_t lb) {
  enum { AGOQ_DIST_MAX = 64 };
  if (la >= AGOQ_DIST_MAX || lb >= AGOQ_DIST_MAX) return AGOQ_DIST_MAX;
  int d[AGOQ_DIST_MAX + 1][AGOQ_DIST_MAX + 1];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    for (size_t j = 1; j <= lb; j++) {
      int cost = toupper((unsigned char)a[i - 1]) == toupper((unsigned char)b[j - 1]) ? 0 : 1;
      int best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  }
  return d[la][lb];
}

const char* agoq_param_closest(const char* name, size_t len) {
  const char* best = NULL;
  int best_d = 0;
  for (int id = 0; id < AGOQ_PARAM_COUNT; id++) {
    const char* cand = agoq_param_table[id].name;
    int dist = agoq_param_distance(name, len, cand, strlen(cand));
    if (best == NULL || dist < best_d) {
      best = cand;
      best_d = dist;
    }
  }
  /* A suggestion only where it is plausibly what was meant: a few edits, at most a third
   * of the part after "AGOQ_" (AGOQ_FOO is not a misspelling of AGOQ_GPU). */
  size_t tail = len > 5 ? len - 5 : 0;
  int limit = (int)(tail / 3) < 3 ? (int)(tail / 3) : 3;
  if (limit < 1) limit = 1;
  return best != NULL && best_d <= limit ? best : NULL;
}

bool agoq_param_name_known(const char* name, size_t len) {
  for (int id = 0; id < AGOQ_PARAM_COUNT; id++) {
    const char* p = agoq_param_table[id].name;
    if (strlen(p) == len && strncmp(p, name, len) == 0) return true;
  }
  for (size_t i = 0; i < sizeof agoq_env_known_other / sizeof agoq_env_known_other[0]; i++) {
    const char* o = agoq_env_known_other[i];
    size_t ol = strlen(o);
    if (ol > 0 && o[ol - 1] == '*') {
      if (len >= ol - 1 && strncmp(o, name, ol - 1) == 0) return true;
    } else if (ol == len && strncmp(o, name, len) == 0) {
      return true;
    }
  }
  return false;
}

int agoq_params_unknown_each(void (*fn)(void* arg, const char* name, size_t len, const char* closest), void* arg) {
  int n = 0;
  for (char** e = environ; e != NULL && *e != NULL; e++) {
    const char* eq = strchr(*e, '=');
    size_t len = eq != NULL ? (size_t)(eq - *e) : strlen(*e);
    if (len <= 5 || strncmp(*e, "AGOQ_", 5) != 0 || agoq_param_name_known(*e, len)) continue;
    fn(arg, *e, len, agoq_param_closest(*e, len));
    n++;
  }
  return n;
}

/* One WARN per AGOQ_* variable nobody reads: a misspelt setting would otherwise leave its
 * default in effect without a word. */
static void agoq_params_warn_unknown(void* arg, const char* name, size_t len, const char* closest) {
  (void)arg;
  char quoted[AGOQ_PARAM_QUOTE_MAX + 4];
  char copy[AGOQ_PARAM_QUOTE_MAX + 1];
  size_t nl = len < AGOQ_PARAM_QUOTE_MAX ? len : AGOQ_PARAM_QUOTE_MAX;
  memcpy(copy, name, nl);
  copy[nl] = '\0';
  agoq_param_quote(copy, quoted, sizeof quoted);
  if (closest != NULL)
    AGOQ_WARN("%s is not an agoq setting and is ignored; did you mean %s? (agoq-info -c lists them all)", quoted,
              closest);
  else
    AGOQ_WARN("%s is not an agoq setting and is ignored (agoq-info -c lists them all)", quoted);
}

ncclResult_t agoq_params_load(void) {
  if (atomic_load_explicit(&agoq_params_loaded, memory_order_acquire)) return agoq_params_result;
  pthread_mutex_lock(&agoq_params_mutex);
  if (!atomic_load_explicit(&agoq_params_loaded, memory_order_relaxed)) {
    /* Every parameter is read even after a failure, so one run reports every bad value. */
    ncclResult_t result = ncclSuccess;
    for (int id = 0; id < AGOQ_PARAM_COUNT; id++) {
      ncclResult_t r = agoq_param_load_one((agoq_param_id)id);
      if (r != ncclSuccess && result == ncclSuccess) result = r;
    }
    /* Not an error for the plugin (a job's environment may carry names meant for a newer
     * agoq); agoq-info -c, the pre-launch check, fails on them. */
    (void)agoq_params_unknown_each(agoq_params_warn_unknown, NULL);
    agoq_params_result = result;
    atomic_store_explicit(&agoq_params_loaded, true, memory_order_release);
  }
  pthread_mutex_unlock(&agoq_params_mutex);
  return agoq_params_result;
}

void agoq_params_reset(void) {
  pthread_mutex_lock(&agoq_params_mutex);
  atomic_store_explicit(&agoq_params_loaded, false, memory_order_relaxed);
  agoq_params_result = ncclSuccess;
  atomic_fetch_add(&agoq_params_gen, 1);
  memset(agoq_param_values, 0, sizeof agoq_param_values);
  pthread_mutex_unlock(&agoq_params_mutex);
}

/* Accessors load on first use, so a reader never sees zeroed slots; after a failed
 * load they still answer (the invalid parameter keeps its default number). */
static const agoq_param_value* agoq_param_slot(agoq_param_id id) {
  if ((int)id < 0 || id >= AGOQ_PARAM_COUNT) return NULL;
  (void)agoq_params_load();
  return &agoq_param_values[id];
}

int64_t agoq_param_int(agoq_param_id id) {
  const agoq_param_value* slot = agoq_param_slot(id);
  return slot != NULL ? slot->value : 0;
}

const char* agoq_param_str(agoq_param_id id) {
  const agoq_param_value* slot = agoq_param_slot(id);
  return slot != NULL ? slot->text : "";
}

const char* agoq_param_source(agoq_param_id id) {
  const agoq_param_value* slot = agoq_param_slot(id);
  return slot != NULL && slot->source != NULL ? slot->source : "default";
}
