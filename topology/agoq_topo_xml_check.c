#include "agoq_topo_xml_check.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- what is accepted ------------------------------------------------------------------ */

typedef enum {
  AGOQ_XE_TOPOLOGY,
  AGOQ_XE_OBJECT,
  AGOQ_XE_INFO,
  AGOQ_XE_PAGE_TYPE,
  AGOQ_XE_SUPPORT,
  AGOQ_XE_CPUKIND,
  AGOQ_XE_DISTANCES2,
  AGOQ_XE_DISTANCES2HETERO,
  AGOQ_XE_INDEXES,
  AGOQ_XE_U64VALUES,
  AGOQ_XE_MEMATTR,
  AGOQ_XE_MEMATTR_VALUE,
  AGOQ_XE_USERDATA,
  AGOQ_XE_COUNT
} agoq_xml_elem;

/* Every element hwloc 2.x's XML writer emits (hwloc/topology-xml.c, hwloc2.dtd). */
static const char* const agoq_xml_elem_names[AGOQ_XE_COUNT] = {
    "topology",  "object",    "info",    "page_type",     "support",  "cpukind",    "distances2",
    "distances2hetero", "indexes", "u64values", "memattr", "memattr_value", "userdata"};

typedef enum {
  AGOQ_XV_TEXT,    /* printable text */
  AGOQ_XV_UINT32,  /* decimal, fits 32 bits */
  AGOQ_XV_UINT64,  /* decimal, fits 64 bits */
  AGOQ_XV_INT32,   /* decimal, optional '-', fits 32 bits */
  AGOQ_XV_BITMAP,  /* hwloc bitmap: 0xXXXXXXXX[,0xXXXXXXXX...], optionally 0xf...f, first */
  AGOQ_XV_TYPE,    /* a known object type */
  AGOQ_XV_BUSID,   /* DDDD:BB:DD.F */
  AGOQ_XV_PCITYPE, /* CCCC [VVVV:DDDD] [VVVV:DDDD] RR */
  AGOQ_XV_FLOAT,   /* decimal with an optional fraction */
  AGOQ_XV_BRTYPE,  /* 0-1 or 1-1 */
  AGOQ_XV_BRPCI,   /* DDDD:[BB-BB] */
  AGOQ_XV_VERSION, /* 2.N */
  AGOQ_XV_INDEXING, /* os or gp */
  AGOQ_XV_BASE64    /* the only userdata encoding: base64 */
} agoq_xml_vkind;

typedef struct {
  agoq_xml_elem elem;
  const char* name;
  agoq_xml_vkind kind;
} agoq_xml_attr_rule;

static const agoq_xml_attr_rule agoq_xml_attr_rules[] = {
    {AGOQ_XE_TOPOLOGY, "version", AGOQ_XV_VERSION},
    {AGOQ_XE_OBJECT, "type", AGOQ_XV_TYPE},
    {AGOQ_XE_OBJECT, "os_index", AGOQ_XV_UINT32},
    {AGOQ_XE_OBJECT, "gp_index", AGOQ_XV_UINT64},
    {AGOQ_XE_OBJECT, "cpuset", AGOQ_XV_BITMAP},
    {AGOQ_XE_OBJECT, "complete_cpuset", AGOQ_XV_BITMAP},
    {AGOQ_XE_OBJECT, "allowed_cpuset", AGOQ_XV_BITMAP},
    {AGOQ_XE_OBJECT, "nodeset", AGOQ_XV_BITMAP},
    {AGOQ_XE_OBJECT, "complete_nodeset", AGOQ_XV_BITMAP},
    {AGOQ_XE_OBJECT, "allowed_nodeset", AGOQ_XV_BITMAP},
    {AGOQ_XE_OBJECT, "name", AGOQ_XV_TEXT},
    {AGOQ_XE_OBJECT, "subtype", AGOQ_XV_TEXT},
    {AGOQ_XE_OBJECT, "local_memory", AGOQ_XV_UINT64},
    {AGOQ_XE_OBJECT, "cache_size", AGOQ_XV_UINT64},
    {AGOQ_XE_OBJECT, "cache_linesize", AGOQ_XV_UINT32},
    {AGOQ_XE_OBJECT, "cache_associativity", AGOQ_XV_INT32},
    {AGOQ_XE_OBJECT, "cache_type", AGOQ_XV_UINT32},
    {AGOQ_XE_OBJECT, "depth", AGOQ_XV_UINT32},
    {AGOQ_XE_OBJECT, "kind", AGOQ_XV_UINT32},
    {AGOQ_XE_OBJECT, "subkind", AGOQ_XV_UINT32},
    {AGOQ_XE_OBJECT, "dont_merge", AGOQ_XV_UINT32},
    {AGOQ_XE_OBJECT, "pci_busid", AGOQ_XV_BUSID},
    {AGOQ_XE_OBJECT, "pci_type", AGOQ_XV_PCITYPE},
    {AGOQ_XE_OBJECT, "pci_link_speed", AGOQ_XV_FLOAT},
    {AGOQ_XE_OBJECT, "bridge_type", AGOQ_XV_BRTYPE},
    {AGOQ_XE_OBJECT, "bridge_pci", AGOQ_XV_BRPCI},
    {AGOQ_XE_OBJECT, "osdev_type", AGOQ_XV_UINT32},
    {AGOQ_XE_INFO, "name", AGOQ_XV_TEXT},
    {AGOQ_XE_INFO, "value", AGOQ_XV_TEXT},
    {AGOQ_XE_PAGE_TYPE, "size", AGOQ_XV_UINT64},
    {AGOQ_XE_PAGE_TYPE, "count", AGOQ_XV_UINT64},
    {AGOQ_XE_SUPPORT, "name", AGOQ_XV_TEXT},
    {AGOQ_XE_SUPPORT, "value", AGOQ_XV_UINT32},
    {AGOQ_XE_CPUKIND, "cpuset", AGOQ_XV_BITMAP},
    {AGOQ_XE_CPUKIND, "forced_efficiency", AGOQ_XV_INT32},
    {AGOQ_XE_DISTANCES2, "type", AGOQ_XV_TYPE},
    {AGOQ_XE_DISTANCES2, "nbobjs", AGOQ_XV_UINT32},
    {AGOQ_XE_DISTANCES2, "indexing", AGOQ_XV_INDEXING},
    {AGOQ_XE_DISTANCES2, "kind", AGOQ_XV_UINT32},
    {AGOQ_XE_DISTANCES2, "name", AGOQ_XV_TEXT},
    {AGOQ_XE_DISTANCES2HETERO, "nbobjs", AGOQ_XV_UINT32},
    {AGOQ_XE_DISTANCES2HETERO, "kind", AGOQ_XV_UINT32},
    {AGOQ_XE_DISTANCES2HETERO, "name", AGOQ_XV_TEXT},
    /* length= counts the characters of the text ("0 1 " is 4), as hwloc checks it. */
    {AGOQ_XE_INDEXES, "length", AGOQ_XV_UINT32},
    {AGOQ_XE_U64VALUES, "length", AGOQ_XV_UINT32},
    {AGOQ_XE_MEMATTR, "name", AGOQ_XV_TEXT},
    {AGOQ_XE_MEMATTR, "flags", AGOQ_XV_UINT64},
    {AGOQ_XE_MEMATTR_VALUE, "target_obj_type", AGOQ_XV_TYPE},
    {AGOQ_XE_MEMATTR_VALUE, "target_obj_gp_index", AGOQ_XV_UINT64},
    {AGOQ_XE_MEMATTR_VALUE, "value", AGOQ_XV_UINT64},
    {AGOQ_XE_MEMATTR_VALUE, "initiator_cpuset", AGOQ_XV_BITMAP},
    {AGOQ_XE_MEMATTR_VALUE, "initiator_obj_gp_index", AGOQ_XV_UINT64},
    {AGOQ_XE_MEMATTR_VALUE, "initiator_obj_type", AGOQ_XV_TYPE},
    {AGOQ_XE_USERDATA, "name", AGOQ_XV_TEXT},
    /* userdata length= counts the decoded bytes; the text is that many characters, or
     * 4*ceil(length/3) with encoding="base64" (hwloc's BASE64_ENCODED_LENGTH). */
    {AGOQ_XE_USERDATA, "length", AGOQ_XV_UINT32},
    {AGOQ_XE_USERDATA, "encoding", AGOQ_XV_BASE64},
};

_Static_assert(sizeof agoq_xml_attr_rules / sizeof agoq_xml_attr_rules[0] <= 64, "seen is a 64-bit mask");

/* Object classes for the nesting rules. */
typedef enum { AGOQ_XO_NORMAL, AGOQ_XO_PU, AGOQ_XO_MEMORY, AGOQ_XO_BRIDGE, AGOQ_XO_PCI, AGOQ_XO_OSDEV, AGOQ_XO_MISC } agoq_xml_oclass;

typedef struct {
  const char* name;
  agoq_xml_oclass cls;
} agoq_xml_type_rule;

static const agoq_xml_type_rule agoq_xml_types[] = {
    {"Machine", AGOQ_XO_NORMAL},  {"Package", AGOQ_XO_NORMAL},  {"Die", AGOQ_XO_NORMAL},
    {"Core", AGOQ_XO_NORMAL},     {"PU", AGOQ_XO_PU},           {"L1Cache", AGOQ_XO_NORMAL},
    {"L2Cache", AGOQ_XO_NORMAL},  {"L3Cache", AGOQ_XO_NORMAL},  {"L4Cache", AGOQ_XO_NORMAL},
    {"L5Cache", AGOQ_XO_NORMAL},  {"L1iCache", AGOQ_XO_NORMAL}, {"L2iCache", AGOQ_XO_NORMAL},
    {"L3iCache", AGOQ_XO_NORMAL}, {"Group", AGOQ_XO_NORMAL},    {"NUMANode", AGOQ_XO_MEMORY},
    {"MemCache", AGOQ_XO_MEMORY}, {"Bridge", AGOQ_XO_BRIDGE},   {"PCIDev", AGOQ_XO_PCI},
    {"OSDev", AGOQ_XO_OSDEV},     {"Misc", AGOQ_XO_MISC},
};

/* ---- the scanner ----------------------------------------------------------------------- */

typedef struct {
  agoq_xml_elem elem;
  int type;        /* object: index in agoq_xml_types, else -1 */
  bool has_object; /* topology: its Machine seen; object: a child object seen */
  /* distances2, distances2hetero: objects, and the indexes and values seen so far */
  uint64_t nbobjs, nindexes, nvalues;
  /* indexes, u64values, userdata: the exact number of characters of text (hwloc compares
   * length= with the text's length, and reads nothing beyond it) */
  uint64_t text_len;
  bool base64; /* userdata with encoding="base64" */
} agoq_xml_frame;

typedef struct {
  const char* p;
  const char* end;
  int line;
  char* err;
  size_t errlen;
  long elements;
  int depth;
  agoq_xml_frame stack[AGOQ_TOPO_XML_MAX_DEPTH];
  char value[AGOQ_TOPO_XML_MAX_VALUE + 1]; /* the attribute value being checked */
} agoq_xml_state;

__attribute__((format(printf, 2, 3))) static int agoq_xml_fail(agoq_xml_state* s, const char* fmt, ...) {
  if (s->err != NULL && s->errlen > 0) {
    int n = snprintf(s->err, s->errlen, "line %d: ", s->line);
    if (n >= 0 && (size_t)n < s->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(s->err + n, s->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return -1;
}

static bool agoq_xml_at(const agoq_xml_state* s, const char* lit) {
  size_t n = strlen(lit);
  return (size_t)(s->end - s->p) >= n && memcmp(s->p, lit, n) == 0;
}

static void agoq_xml_adv(agoq_xml_state* s, size_t n) {
  for (size_t i = 0; i < n && s->p < s->end; i++, s->p++)
    if (*s->p == '\n') s->line++;
}

static bool agoq_xml_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void agoq_xml_skip_ws(agoq_xml_state* s) {
  while (s->p < s->end && agoq_xml_is_ws(*s->p)) agoq_xml_adv(s, 1);
}

static bool agoq_xml_name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }

/* A name of [a-z0-9_], at most 32 characters, copied into out. */
static int agoq_xml_name(agoq_xml_state* s, char out[40]) {
  size_t n = 0;
  while (s->p < s->end && agoq_xml_name_char(*s->p)) {
    if (n >= 32) return agoq_xml_fail(s, "name too long");
    out[n++] = *s->p;
    agoq_xml_adv(s, 1);
  }
  out[n] = '\0';
  if (n == 0) return agoq_xml_fail(s, "expected a name");
  return 0;
}

/* Comment: <!-- ... --> without "--" inside. */
static int agoq_xml_comment(agoq_xml_state* s) {
  agoq_xml_adv(s, 4);
  while (s->p < s->end) {
    if (agoq_xml_at(s, "-->")) {
      agoq_xml_adv(s, 3);
      return 0;
    }
    if (agoq_xml_at(s, "--")) return agoq_xml_fail(s, "\"--\" inside a comment");
    unsigned char c = (unsigned char)*s->p;
    if (c < 0x20 && !agoq_xml_is_ws((char)c)) return agoq_xml_fail(s, "control character in a comment");
    agoq_xml_adv(s, 1);
  }
  return agoq_xml_fail(s, "unterminated comment");
}

/* Whitespace and comments (outside <topology> only). */
static int agoq_xml_misc(agoq_xml_state* s) {
  for (;;) {
    agoq_xml_skip_ws(s);
    if (!agoq_xml_at(s, "<!--")) return 0;
    if (agoq_xml_comment(s) != 0) return -1;
  }
}

/* ---- typed attribute values ---------------------------------------------------------------- */

static bool agoq_xml_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static bool agoq_xml_digits(const char* v, size_t* i, size_t min, size_t max, bool hex) {
  size_t n = 0;
  while (v[*i] != '\0' && (hex ? agoq_xml_hex(v[*i]) : (v[*i] >= '0' && v[*i] <= '9'))) (*i)++, n++;
  return n >= min && n <= max;
}

static bool agoq_xml_uint(const char* v, uint64_t max) {
  if (v[0] == '\0' || strlen(v) > 20) return false;
  uint64_t x = 0;
  for (const char* c = v; *c != '\0'; c++) {
    if (*c < '0' || *c > '9') return false;
    uint64_t d = (uint64_t)(*c - '0');
    if (x > (max - d) / 10) return false;
    x = x * 10 + d;
  }
  return true;
}

/* hwloc_bitmap_snprintf's output: 32-bit words "0x%08lx" from the most significant down,
 * comma-separated; a zero word that is neither the first nor the last is written as
 * nothing ("0x00000001,,0x0" is bit 64: ulongs {0, 1}); a bitmap that is infinite
 * starts with "0xf...f" (alone for a full one, then "," and the words below its
 * all-ones prefix, where a zero word may be empty too). The first word of a finite
 * bitmap and the last word are never empty. */
static bool agoq_xml_bitmap(const char* v) {
  size_t i = 0;
  bool empty_ok = false; /* may the next word be empty? */
  if (strncmp(v, "0xf...f", 7) == 0) {
    i = 7;
    if (v[i] == '\0') return true;
    if (v[i++] != ',') return false;
    empty_ok = true;
  }
  for (;;) {
    if (v[i] == ',' && empty_ok) {
      i++;
      continue;
    }
    if (v[i] != '0' || v[i + 1] != 'x') return false;
    i += 2;
    if (!agoq_xml_digits(v, &i, 1, 8, true)) return false;
    if (v[i] == '\0') return true;
    if (v[i++] != ',') return false;
    empty_ok = true;
  }
}

static bool agoq_xml_lit(const char* v, size_t* i, char c) {
  if (v[*i] != c) return false;
  (*i)++;
  return true;
}

static bool agoq_xml_value_ok(agoq_xml_vkind k, const char* v, int* type_index) {
  size_t i = 0;
  switch (k) {
    case AGOQ_XV_TEXT: return true; /* characters already checked */
    case AGOQ_XV_UINT32: return agoq_xml_uint(v, UINT32_MAX);
    case AGOQ_XV_UINT64: return agoq_xml_uint(v, UINT64_MAX);
    case AGOQ_XV_INT32: return agoq_xml_uint(v[0] == '-' ? v + 1 : v, INT32_MAX);
    case AGOQ_XV_BITMAP: return agoq_xml_bitmap(v);
    case AGOQ_XV_TYPE:
      for (size_t t = 0; t < sizeof agoq_xml_types / sizeof agoq_xml_types[0]; t++)
        if (strcmp(v, agoq_xml_types[t].name) == 0) {
          *type_index = (int)t;
          return true;
        }
      return false;
    case AGOQ_XV_BUSID:
      return agoq_xml_digits(v, &i, 4, 4, true) && agoq_xml_lit(v, &i, ':') && agoq_xml_digits(v, &i, 2, 2, true) &&
             agoq_xml_lit(v, &i, ':') && agoq_xml_digits(v, &i, 2, 2, true) && agoq_xml_lit(v, &i, '.') &&
             agoq_xml_digits(v, &i, 1, 1, true) && v[i] == '\0';
    case AGOQ_XV_PCITYPE:
      return agoq_xml_digits(v, &i, 4, 4, true) && agoq_xml_lit(v, &i, ' ') && agoq_xml_lit(v, &i, '[') &&
             agoq_xml_digits(v, &i, 4, 4, true) && agoq_xml_lit(v, &i, ':') && agoq_xml_digits(v, &i, 4, 4, true) &&
             agoq_xml_lit(v, &i, ']') && agoq_xml_lit(v, &i, ' ') && agoq_xml_lit(v, &i, '[') &&
             agoq_xml_digits(v, &i, 4, 4, true) && agoq_xml_lit(v, &i, ':') && agoq_xml_digits(v, &i, 4, 4, true) &&
             agoq_xml_lit(v, &i, ']') && agoq_xml_lit(v, &i, ' ') && agoq_xml_digits(v, &i, 2, 2, true) && v[i] == '\0';
    case AGOQ_XV_FLOAT:
      if (!agoq_xml_digits(v, &i, 1, 12, false)) return false;
      if (v[i] == '.') {
        i++;
        if (!agoq_xml_digits(v, &i, 1, 12, false)) return false;
      }
      return v[i] == '\0';
    case AGOQ_XV_BRTYPE:
      return (v[0] == '0' || v[0] == '1') && v[1] == '-' && v[2] == '1' && v[3] == '\0';
    case AGOQ_XV_BRPCI:
      return agoq_xml_digits(v, &i, 4, 4, true) && agoq_xml_lit(v, &i, ':') && agoq_xml_lit(v, &i, '[') &&
             agoq_xml_digits(v, &i, 2, 2, true) && agoq_xml_lit(v, &i, '-') && agoq_xml_digits(v, &i, 2, 2, true) &&
             agoq_xml_lit(v, &i, ']') && v[i] == '\0';
    case AGOQ_XV_VERSION:
      return v[0] == '2' && v[1] == '.' && agoq_xml_digits(v, (i = 2, &i), 1, 3, false) && v[i] == '\0';
    case AGOQ_XV_INDEXING: return strcmp(v, "os") == 0 || strcmp(v, "gp") == 0;
    case AGOQ_XV_BASE64: return strcmp(v, "base64") == 0;
  }
  return false;
}

/* An attribute value in quotes: printable ASCII (all hwloc writes), '&' only in the five
 * predefined entities or &#10; &#13; &#9;, no '<'. Unescaped into out (at most AGOQ_TOPO_XML_MAX_VALUE characters). */
static int agoq_xml_attr_value(agoq_xml_state* s, char* out) {
  if (s->p >= s->end || (*s->p != '"' && *s->p != '\'')) return agoq_xml_fail(s, "expected a quoted value");
  char q = *s->p;
  agoq_xml_adv(s, 1);
  size_t n = 0;
  /* The five predefined entities, and the character references hwloc writes for the
   * newline, carriage return and tab it lets through in names and values. */
  static const char* const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#10;", "&#13;", "&#9;"};
  static const char entc[] = {'&', '<', '>', '"', '\'', '\n', '\r', '\t'};
  const size_t nents = sizeof ents / sizeof ents[0];
  while (s->p < s->end && *s->p != q) {
    if (n >= AGOQ_TOPO_XML_MAX_VALUE) return agoq_xml_fail(s, "attribute value longer than %d characters", AGOQ_TOPO_XML_MAX_VALUE);
    unsigned char c = (unsigned char)*s->p;
    if (c == '<') return agoq_xml_fail(s, "'<' in an attribute value");
    if (c < 0x20 || c > 0x7e) return agoq_xml_fail(s, "byte 0x%02x in an attribute value (printable ASCII only)", c);
    if (c == '&') {
      size_t e = 0;
      while (e < nents && !agoq_xml_at(s, ents[e])) e++;
      if (e == nents) return agoq_xml_fail(s, "unknown entity in an attribute value");
      out[n++] = entc[e];
      agoq_xml_adv(s, strlen(ents[e]));
      continue;
    }
    out[n++] = (char)c;
    agoq_xml_adv(s, 1);
  }
  if (s->p >= s->end) return agoq_xml_fail(s, "unterminated attribute value");
  agoq_xml_adv(s, 1);
  out[n] = '\0';
  return 0;
}

/* ---- structure ----------------------------------------------------------------------------- */

static bool agoq_xml_child_ok(const agoq_xml_frame* parent, agoq_xml_elem e) {
  if (parent == NULL) return e == AGOQ_XE_TOPOLOGY;
  switch (parent->elem) {
    case AGOQ_XE_TOPOLOGY:
      /* no <info>: hwloc 2.x writes none there (3.x does), and hwloc 2.9 stops reading at one */
      return e == AGOQ_XE_OBJECT || e == AGOQ_XE_SUPPORT || e == AGOQ_XE_CPUKIND || e == AGOQ_XE_DISTANCES2 || e == AGOQ_XE_DISTANCES2HETERO || e == AGOQ_XE_MEMATTR;
    case AGOQ_XE_OBJECT:
      return e == AGOQ_XE_OBJECT || e == AGOQ_XE_INFO || e == AGOQ_XE_USERDATA ||
             (e == AGOQ_XE_PAGE_TYPE && strcmp(agoq_xml_types[parent->type].name, "NUMANode") == 0);
    case AGOQ_XE_CPUKIND: return e == AGOQ_XE_INFO;
    case AGOQ_XE_MEMATTR: return e == AGOQ_XE_MEMATTR_VALUE || e == AGOQ_XE_INFO;
    case AGOQ_XE_DISTANCES2:
    case AGOQ_XE_DISTANCES2HETERO: return e == AGOQ_XE_INDEXES || e == AGOQ_XE_U64VALUES || e == AGOQ_XE_INFO;
    default: return false;
  }
}

/* Nesting of object classes, following hwloc 2's tree: normal children of normal objects,
 * memory children of normal or memory objects, I/O children of normal objects, bridges or
 * PCI devices (OS devices only as leaves of those), Misc anywhere. */
static bool agoq_xml_object_ok(const agoq_xml_frame* parent, agoq_xml_oclass c) {
  if (parent->elem == AGOQ_XE_TOPOLOGY) return false; /* the Machine is checked by the caller */
  agoq_xml_oclass p = agoq_xml_types[parent->type].cls;
  if (c == AGOQ_XO_MISC) return true;
  switch (p) {
    case AGOQ_XO_NORMAL: return true;
    case AGOQ_XO_PU: return c == AGOQ_XO_MEMORY || c == AGOQ_XO_BRIDGE || c == AGOQ_XO_PCI || c == AGOQ_XO_OSDEV;
    case AGOQ_XO_MEMORY: return c == AGOQ_XO_MEMORY;
    case AGOQ_XO_BRIDGE: return c == AGOQ_XO_BRIDGE || c == AGOQ_XO_PCI;
    case AGOQ_XO_PCI: return c == AGOQ_XO_OSDEV;
    case AGOQ_XO_OSDEV: return false;
    case AGOQ_XO_MISC: return false;
  }
  return false;
}

static bool agoq_xml_seen(uint64_t seen, agoq_xml_elem e, const char* name) {
  for (size_t r = 0; r < sizeof agoq_xml_attr_rules / sizeof agoq_xml_attr_rules[0]; r++)
    if (agoq_xml_attr_rules[r].elem == e && strcmp(agoq_xml_attr_rules[r].name, name) == 0)
      return (seen >> r) & 1u;
  return false;
}

/* Normal and memory objects need their sets (hwloc dereferences them unchecked); I/O and
 * Misc objects must not have any. */
static int agoq_xml_object_attrs(agoq_xml_state* s, agoq_xml_oclass c, uint64_t seen) {
  static const char* const set_attrs[] = {"cpuset", "complete_cpuset", "nodeset", "complete_nodeset"};
  bool needs = c == AGOQ_XO_NORMAL || c == AGOQ_XO_PU || c == AGOQ_XO_MEMORY;
  for (int i = 0; i < 4; i++) {
    bool has = agoq_xml_seen(seen, AGOQ_XE_OBJECT, set_attrs[i]);
    if (needs && !has) return agoq_xml_fail(s, "object without %s", set_attrs[i]);
    if (!needs && has) return agoq_xml_fail(s, "I/O or Misc object with a %s", set_attrs[i]);
  }
  if (!needs && (agoq_xml_seen(seen, AGOQ_XE_OBJECT, "allowed_cpuset") || agoq_xml_seen(seen, AGOQ_XE_OBJECT, "allowed_nodeset")))
    return agoq_xml_fail(s, "I/O or Misc object with an allowed set");
  return 0;
}

/* What a document of another hwloc generation gets told (hwloc 2.x reads 1.x XML and
 * writes 2.x XML, so it converts). */
#define AGOQ_XML_V1_HINT                                                                                \
  "this is hwloc 1.x XML; agoq reads hwloc 2.x XML: convert it with hwloc 2.x, "                        \
  "'lstopo-no-graphics --input OLD.xml --of xml NEW.xml'"

static bool agoq_xml_is_v1_type(const char* v) {
  return strcmp(v, "Socket") == 0 || strcmp(v, "Cache") == 0 || strcmp(v, "System") == 0;
}

/* Parses one start tag's attributes for element e into frame f. *selfclose tells <x/>. */
static int agoq_xml_attrs(agoq_xml_state* s, agoq_xml_frame* f, bool* selfclose) {
  char* value = s->value;
  /* Which rules were seen (bit = index in agoq_xml_attr_rules). */
  uint64_t seen = 0;
  int nattrs = 0;
  bool has_type = false, has_osdev = false, has_busid = false, has_pcitype = false, has_brtype = false;
  bool has_name = false, has_value = false, has_nbobjs = false, has_length = false, has_version = false;
  uint64_t length = 0, kind = 0;
  f->type = -1;
  for (;;) {
    const char* before = s->p;
    agoq_xml_skip_ws(s);
    if (agoq_xml_at(s, "/>")) {
      agoq_xml_adv(s, 2);
      *selfclose = true;
      break;
    }
    if (agoq_xml_at(s, ">")) {
      agoq_xml_adv(s, 1);
      *selfclose = false;
      break;
    }
    if (s->p == before) return agoq_xml_fail(s, "expected whitespace before an attribute");
    if (++nattrs > AGOQ_TOPO_XML_MAX_ATTRS) return agoq_xml_fail(s, "more than %d attributes", AGOQ_TOPO_XML_MAX_ATTRS);
    char name[40];
    if (agoq_xml_name(s, name) != 0) return -1;
    agoq_xml_skip_ws(s);
    if (!agoq_xml_at(s, "=")) return agoq_xml_fail(s, "expected '=' after %s", name);
    agoq_xml_adv(s, 1);
    agoq_xml_skip_ws(s);
    if (agoq_xml_attr_value(s, value) != 0) return -1;
    size_t r = 0, nr = sizeof agoq_xml_attr_rules / sizeof agoq_xml_attr_rules[0];
    while (r < nr && !(agoq_xml_attr_rules[r].elem == f->elem && strcmp(agoq_xml_attr_rules[r].name, name) == 0)) r++;
    if (r == nr && f->elem == AGOQ_XE_OBJECT && strcmp(name, "online_cpuset") == 0)
      return agoq_xml_fail(s, "attribute online_cpuset: " AGOQ_XML_V1_HINT);
    if (r == nr) return agoq_xml_fail(s, "unknown attribute %s on <%s>", name, agoq_xml_elem_names[f->elem]);
    if ((seen >> r) & 1u) return agoq_xml_fail(s, "duplicate attribute %s", name);
    seen |= (uint64_t)1 << r;
    int type_index = -1;
    if (!agoq_xml_value_ok(agoq_xml_attr_rules[r].kind, value, &type_index)) {
      if (agoq_xml_attr_rules[r].kind == AGOQ_XV_TYPE && agoq_xml_is_v1_type(value))
        return agoq_xml_fail(s, "type=\"%s\": " AGOQ_XML_V1_HINT, value);
      if (agoq_xml_attr_rules[r].kind == AGOQ_XV_VERSION)
        return agoq_xml_fail(s, "hwloc XML version \"%.16s\": agoq reads version 2.x (what hwloc 2.x writes)", value);
      return agoq_xml_fail(s, "invalid value for %s on <%s>", name, agoq_xml_elem_names[f->elem]);
    }
    if (f->elem == AGOQ_XE_OBJECT && strcmp(name, "type") == 0) f->type = type_index, has_type = true;
    if (strcmp(name, "osdev_type") == 0) has_osdev = true;
    if (strcmp(name, "pci_busid") == 0) has_busid = true;
    if (strcmp(name, "pci_type") == 0) has_pcitype = true;
    if (strcmp(name, "bridge_type") == 0) has_brtype = true;
    if (strcmp(name, "name") == 0) has_name = true;
    if (strcmp(name, "value") == 0) has_value = true;
    if (strcmp(name, "version") == 0) has_version = true;
    if (strcmp(name, "encoding") == 0) f->base64 = true;
    /* The values below passed agoq_xml_uint: decimal and in range. */
    if (strcmp(name, "nbobjs") == 0) {
      has_nbobjs = true;
      uint64_t n = 0;
      for (const char* c = value; *c; c++) n = n * 10 + (uint64_t)(*c - '0');
      if (n == 0 || n > AGOQ_TOPO_XML_MAX_DIST_OBJS) return agoq_xml_fail(s, "distances over %s objects", value);
      f->nbobjs = n;
    }
    if (strcmp(name, "length") == 0) {
      has_length = true;
      for (const char* c = value; *c; c++) length = length * 10 + (uint64_t)(*c - '0');
    }
    if (strcmp(name, "kind") == 0)
      for (const char* c = value; *c; c++) kind = kind * 10 + (uint64_t)(*c - '0');
  }
  const char* ename = agoq_xml_elem_names[f->elem];
  switch (f->elem) {
    case AGOQ_XE_TOPOLOGY:
      if (!has_version) return agoq_xml_fail(s, "<topology> without version=\"2.0\": " AGOQ_XML_V1_HINT);
      break;
    case AGOQ_XE_OBJECT: {
      if (!has_type) return agoq_xml_fail(s, "object without a type");
      agoq_xml_oclass c = agoq_xml_types[f->type].cls;
      if (agoq_xml_object_attrs(s, c, seen) != 0) return -1;
      if (c == AGOQ_XO_OSDEV && !has_osdev) return agoq_xml_fail(s, "OSDev without osdev_type");
      if (c == AGOQ_XO_OSDEV && !has_name) return agoq_xml_fail(s, "OSDev without a name");
      if (c == AGOQ_XO_PCI && (!has_busid || !has_pcitype)) return agoq_xml_fail(s, "PCIDev without pci_busid/pci_type");
      if (c == AGOQ_XO_BRIDGE && !has_brtype) return agoq_xml_fail(s, "Bridge without bridge_type");
      if (c != AGOQ_XO_OSDEV && has_osdev) return agoq_xml_fail(s, "osdev_type on a non-OSDev object");
      if (c != AGOQ_XO_PCI && c != AGOQ_XO_BRIDGE && (has_busid || has_pcitype))
        return agoq_xml_fail(s, "PCI attributes on a non-PCI object");
      if (c != AGOQ_XO_BRIDGE && has_brtype) return agoq_xml_fail(s, "bridge_type on a non-bridge object");
      break;
    }
    case AGOQ_XE_INFO:
    case AGOQ_XE_SUPPORT:
      if (!has_name) return agoq_xml_fail(s, "<%s> without a name", ename);
      if (f->elem == AGOQ_XE_INFO && !has_value) return agoq_xml_fail(s, "<info> without a value");
      break;
    case AGOQ_XE_CPUKIND:
      if (!agoq_xml_seen(seen, AGOQ_XE_CPUKIND, "cpuset")) return agoq_xml_fail(s, "<cpukind> without a cpuset");
      break;
    case AGOQ_XE_DISTANCES2:
    case AGOQ_XE_DISTANCES2HETERO:
      if (!has_nbobjs) return agoq_xml_fail(s, "<%s> without nbobjs", ename);
      if (!agoq_xml_seen(seen, f->elem, "kind") || kind == 0) return agoq_xml_fail(s, "<%s> without a kind", ename);
      if (f->elem == AGOQ_XE_DISTANCES2 &&
          (!agoq_xml_seen(seen, f->elem, "type") || !agoq_xml_seen(seen, f->elem, "indexing")))
        return agoq_xml_fail(s, "<distances2> without type and indexing");
      if (*selfclose) return agoq_xml_fail(s, "<%s> without indexes and values", ename);
      break;
    case AGOQ_XE_INDEXES:
    case AGOQ_XE_U64VALUES:
      if (!has_length || length == 0) return agoq_xml_fail(s, "<%s> without a length", ename);
      if (*selfclose) return agoq_xml_fail(s, "empty <%s>", ename);
      f->text_len = length;
      break;
    case AGOQ_XE_MEMATTR:
      if (!has_name || !agoq_xml_seen(seen, f->elem, "flags")) return agoq_xml_fail(s, "<memattr> without name and flags");
      break;
    case AGOQ_XE_MEMATTR_VALUE:
      if (!has_value || !agoq_xml_seen(seen, f->elem, "target_obj_type") ||
          !agoq_xml_seen(seen, f->elem, "target_obj_gp_index"))
        return agoq_xml_fail(s, "<memattr_value> without target_obj_type, target_obj_gp_index and value");
      if (agoq_xml_seen(seen, f->elem, "initiator_obj_gp_index") != agoq_xml_seen(seen, f->elem, "initiator_obj_type"))
        return agoq_xml_fail(s, "<memattr_value> with only one of initiator_obj_gp_index and initiator_obj_type");
      break;
    case AGOQ_XE_USERDATA:
      f->text_len = f->base64 ? 4 * ((length + 2) / 3) : length;
      if (*selfclose && f->text_len != 0) return agoq_xml_fail(s, "empty <userdata> of length %llu", (unsigned long long)length);
      break;
    default: break;
  }
  return 0;
}

static bool agoq_xml_b64_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/' || c == '=';
}

/* One token of <indexes>/<u64values>: a decimal number, or TYPE:GP_INDEX in the indexes of
 * a <distances2hetero>. */
static bool agoq_xml_token_ok(const char* tok, bool typed) {
  if (typed) {
    const char* colon = strchr(tok, ':');
    if (colon == NULL || colon - tok > 20) return false;
    char type[24];
    memcpy(type, tok, (size_t)(colon - tok));
    type[colon - tok] = '\0';
    int ignored;
    if (!agoq_xml_value_ok(AGOQ_XV_TYPE, type, &ignored)) return false;
    tok = colon + 1;
  }
  return agoq_xml_uint(tok, UINT64_MAX);
}

/* The text of <indexes>, <u64values> or <userdata> (f, child of parent): exactly
 * f->text_len characters up to the next '<'. Numbers are what hwloc writes ("%llu " each,
 * so single spaces and one trailing space); they count toward the parent's matrix. */
static int agoq_xml_text(agoq_xml_state* s, agoq_xml_frame* f, agoq_xml_frame* parent) {
  const char* start = s->p;
  const char* lt = memchr(s->p, '<', (size_t)(s->end - s->p));
  if (lt == NULL) return agoq_xml_fail(s, "document ends inside <%s>", agoq_xml_elem_names[f->elem]);
  size_t n = (size_t)(lt - start);
  if (n != f->text_len)
    return agoq_xml_fail(s, "<%s> holds %zu characters but length=\"%llu\" (%s)", agoq_xml_elem_names[f->elem], n,
                         (unsigned long long)f->text_len,
                         f->elem == AGOQ_XE_USERDATA ? "the data's bytes" : "hwloc's length= counts characters");
  if (f->elem == AGOQ_XE_USERDATA) {
    for (const char* c = start; c < lt; c++) {
      unsigned char u = (unsigned char)*c;
      if (f->base64 ? !agoq_xml_b64_char((char)u) : ((u < 0x20 && !agoq_xml_is_ws((char)u)) || u > 0x7e))
        return agoq_xml_fail(s, "byte 0x%02x in <userdata>%s", u, f->base64 ? " (base64 expected)" : "");
    }
    agoq_xml_adv(s, n);
    return 0;
  }
  bool typed = f->elem == AGOQ_XE_INDEXES && parent->elem == AGOQ_XE_DISTANCES2HETERO;
  uint64_t* count = f->elem == AGOQ_XE_INDEXES ? &parent->nindexes : &parent->nvalues;
  uint64_t max = f->elem == AGOQ_XE_INDEXES ? parent->nbobjs : parent->nbobjs * parent->nbobjs;
  const char* c = start;
  while (c < lt) {
    char tok[48];
    size_t k = 0;
    while (c < lt && *c != ' ') {
      if (k + 1 >= sizeof tok) return agoq_xml_fail(s, "number too long in <%s>", agoq_xml_elem_names[f->elem]);
      tok[k++] = *c++;
    }
    tok[k] = '\0';
    if (k == 0 || !agoq_xml_token_ok(tok, typed))
      return agoq_xml_fail(s, "<%s> wants %s separated by single spaces", agoq_xml_elem_names[f->elem],
                           typed ? "TYPE:INDEX pairs" : "decimal numbers");
    if (++*count > max)
      return agoq_xml_fail(s, "more than %llu %s in <%s>", (unsigned long long)max,
                           f->elem == AGOQ_XE_INDEXES ? "indexes" : "values", agoq_xml_elem_names[parent->elem]);
    if (c < lt) c++; /* the space after it */
  }
  agoq_xml_adv(s, n);
  return 0;
}

static int agoq_xml_document(agoq_xml_state* s) {
  /* Prolog. */
  if (agoq_xml_at(s, "<?xml")) {
    agoq_xml_adv(s, 5);
    const char* start = s->p;
    while (s->p < s->end && !agoq_xml_at(s, "?>")) {
      unsigned char c = (unsigned char)*s->p;
      if (c == '<' || c == '>' || c > 0x7e || (c < 0x20 && !agoq_xml_is_ws((char)c)) || s->p - start > 256)
        return agoq_xml_fail(s, "malformed XML declaration");
      agoq_xml_adv(s, 1);
    }
    if (s->p >= s->end) return agoq_xml_fail(s, "unterminated XML declaration");
    agoq_xml_adv(s, 2);
  }
  if (agoq_xml_misc(s) != 0) return -1;
  if (agoq_xml_at(s, "<!DOCTYPE")) {
    /* hwloc2.dtd from hwloc 2.x; hwloc.dtd from 1.x, whose <topology> has no version
     * and is refused with a conversion hint below. */
    static const char* const doctypes[] = {"<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">",
                                           "<!DOCTYPE topology SYSTEM \"hwloc.dtd\">"};
    size_t d = 0;
    while (d < 2 && !agoq_xml_at(s, doctypes[d])) d++;
    if (d == 2) return agoq_xml_fail(s, "unsupported DOCTYPE (expected <!DOCTYPE topology SYSTEM \"hwloc2.dtd\">)");
    agoq_xml_adv(s, strlen(doctypes[d]));
  }
  if (agoq_xml_misc(s) != 0) return -1;
  if (!agoq_xml_at(s, "<topology")) return agoq_xml_fail(s, "expected <topology>");

  /* Elements. */
  bool root_done = false;
  while (!root_done) {
    agoq_xml_frame* top = s->depth > 0 ? &s->stack[s->depth - 1] : NULL;
    if (top != NULL && (top->elem == AGOQ_XE_INDEXES || top->elem == AGOQ_XE_U64VALUES || top->elem == AGOQ_XE_USERDATA)) {
      /* a text element sits below its parent: depth >= 2 */
      if (agoq_xml_text(s, top, &s->stack[s->depth - 2]) != 0) return -1;
    } else {
      agoq_xml_skip_ws(s);
    }
    if (s->p >= s->end) return agoq_xml_fail(s, "document ends inside <%s>", top ? agoq_xml_elem_names[top->elem] : "?");
    if (*s->p != '<') return agoq_xml_fail(s, "text content where only elements may be");
    if (agoq_xml_at(s, "<!--")) return agoq_xml_fail(s, "comment inside <topology> (hwloc drops objects after it)");
    if (agoq_xml_at(s, "<!") || agoq_xml_at(s, "<?")) return agoq_xml_fail(s, "CDATA, DTD or processing instruction inside <topology>");
    char name[40];
    if (agoq_xml_at(s, "</")) {
      agoq_xml_adv(s, 2);
      if (agoq_xml_name(s, name) != 0) return -1;
      agoq_xml_skip_ws(s);
      if (!agoq_xml_at(s, ">")) return agoq_xml_fail(s, "expected '>' in an end tag");
      agoq_xml_adv(s, 1);
      if (top == NULL || strcmp(name, agoq_xml_elem_names[top->elem]) != 0)
        return agoq_xml_fail(s, "</%s> does not close <%s>", name, top ? agoq_xml_elem_names[top->elem] : "nothing");
      goto close_element;
    }
    agoq_xml_adv(s, 1);
    if (agoq_xml_name(s, name) != 0) return -1;
    agoq_xml_elem e = 0;
    while (e < AGOQ_XE_COUNT && strcmp(name, agoq_xml_elem_names[e]) != 0) e++;
    if (e == AGOQ_XE_COUNT && (strcmp(name, "distances") == 0 || strcmp(name, "latency") == 0))
      return agoq_xml_fail(s, "element <%s>: " AGOQ_XML_V1_HINT, name);
    if (e == AGOQ_XE_COUNT) return agoq_xml_fail(s, "unknown element <%s>", name);
    if (!agoq_xml_child_ok(top, e))
      return agoq_xml_fail(s, "<%s> is not allowed inside <%s>", name, top ? agoq_xml_elem_names[top->elem] : "(document)");
    if (s->depth >= AGOQ_TOPO_XML_MAX_DEPTH) return agoq_xml_fail(s, "nesting deeper than %d", AGOQ_TOPO_XML_MAX_DEPTH);
    if (++s->elements > AGOQ_TOPO_XML_MAX_ELEMENTS) return agoq_xml_fail(s, "more than %d elements", AGOQ_TOPO_XML_MAX_ELEMENTS);
    /* hwloc reads an object's page_type, info and userdata before its child objects and
     * refuses them after; and a <topology> starts with its Machine. */
    if (top != NULL && top->elem == AGOQ_XE_OBJECT && e != AGOQ_XE_OBJECT && top->has_object)
      return agoq_xml_fail(s, "<%s> after child objects (hwloc wants it before them)", name);
    if (top != NULL && top->elem == AGOQ_XE_TOPOLOGY && e != AGOQ_XE_OBJECT && !top->has_object)
      return agoq_xml_fail(s, "<%s> before the Machine object", name);
    agoq_xml_frame* f = &s->stack[s->depth];
    memset(f, 0, sizeof *f);
    f->elem = e;
    bool selfclose = false;
    if (agoq_xml_attrs(s, f, &selfclose) != 0) return -1;
    if (e == AGOQ_XE_OBJECT) {
      agoq_xml_oclass c = agoq_xml_types[f->type].cls;
      if (top->elem == AGOQ_XE_TOPOLOGY) {
        if (top->has_object || strcmp(agoq_xml_types[f->type].name, "Machine") != 0)
          return agoq_xml_fail(s, "<topology> must hold exactly one Machine object");
        top->has_object = true;
      } else if (!agoq_xml_object_ok(top, c) || strcmp(agoq_xml_types[f->type].name, "Machine") == 0) {
        return agoq_xml_fail(s, "a %s object cannot be a child of a %s object", agoq_xml_types[f->type].name,
                             agoq_xml_types[top->type].name);
      } else {
        top->has_object = true;
      }
    }
    s->depth++;
    if (!selfclose) continue;
    top = f;
  close_element:
    if (top->elem == AGOQ_XE_TOPOLOGY && !top->has_object) return agoq_xml_fail(s, "<topology> without a Machine object");
    if ((top->elem == AGOQ_XE_DISTANCES2 || top->elem == AGOQ_XE_DISTANCES2HETERO) &&
        (top->nindexes != top->nbobjs || top->nvalues != top->nbobjs * top->nbobjs))
      return agoq_xml_fail(s, "<%s> of %llu objects needs %llu indexes and %llu values, has %llu and %llu",
                           agoq_xml_elem_names[top->elem], (unsigned long long)top->nbobjs,
                           (unsigned long long)top->nbobjs, (unsigned long long)(top->nbobjs * top->nbobjs),
                           (unsigned long long)top->nindexes, (unsigned long long)top->nvalues);
    s->depth--;
    if (s->depth == 0) root_done = true;
  }
  if (agoq_xml_misc(s) != 0) return -1;
  if (s->p != s->end) return agoq_xml_fail(s, "content after </topology>");
  return 0;
}

int agoq_topo_xml_check(const char* buf, size_t len, char* err, size_t errlen) {
  agoq_xml_state s = {.p = buf, .end = buf + len, .line = 1, .err = err, .errlen = errlen};
  if (err != NULL && errlen > 0) err[0] = '\0';
  if (buf == NULL) return agoq_xml_fail(&s, "no document");
  if (len > 0 && buf[len - 1] == '\0') s.end--; /* hwloc counts the terminating NUL */
  if ((size_t)(s.end - s.p) > AGOQ_TOPO_XML_MAX_BYTES)
    return agoq_xml_fail(&s, "document larger than %u bytes", AGOQ_TOPO_XML_MAX_BYTES);
  if (memchr(s.p, '\0', (size_t)(s.end - s.p)) != NULL) return agoq_xml_fail(&s, "NUL byte in the document");
  return agoq_xml_document(&s);
}
