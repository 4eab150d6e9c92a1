/* `agoq-info -c`: the parameter table as text (values in effect) and as Markdown (docs). */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_info.h"
#include "collnet/agoq_collnet.h"
#include "core/agoq_log.h"
#include "core/agoq_params.h"
#include "net/agoq_net_config.h"

extern char** environ;

#define AGOQ_INFO_WIDTH 88

void agoq_info_size_human(long long v, char* buf, size_t len) {
  static const char units[] = "TGMK";
  for (int i = 0; i < 4; i++) {
    int shift = 10 * (4 - i);
    long long unit = 1LL << shift;
    if (v != 0 && v % unit == 0) {
      snprintf(buf, len, "%lld%c", v / unit, units[i]);
      return;
    }
  }
  snprintf(buf, len, "%lld", v);
}

void agoq_info_wrap(FILE* out, const char* text, int indent, int width) {
  const char* p = text;
  while (*p != '\0') {
    while (*p == ' ') p++;
    if (*p == '\0') break;
    /* Take words while they fit; a single over-long word gets a line of its own. */
    const char* line_end = p;
    const char* q = p;
    while (*q != '\0') {
      const char* word_end = q;
      while (*word_end != '\0' && *word_end != ' ') word_end++;
      if (line_end != p && indent + (word_end - p) > width) break;
      line_end = word_end;
      q = word_end;
      while (*q == ' ') q++;
    }
    fprintf(out, "%*s%.*s\n", indent, "", (int)(line_end - p), p);
    p = line_end;
  }
}

/* What a parameter accepts, for a human (markdown = false) or a Markdown table cell. */
static void agoq_info_allowed(const agoq_param_desc* d, bool markdown, char* buf, size_t len) {
  const char* q = markdown ? "`" : "";
  char lo[32], hi[32];
  switch (d->type) {
    case AGOQ_PARAM_TYPE_INT:
      snprintf(buf, len, "%s%" PRId64 "%s to %s%" PRId64 "%s", q, d->min, q, q, d->max, q);
      break;
    case AGOQ_PARAM_TYPE_SIZE:
      agoq_info_size_human(d->min, lo, sizeof lo);
      agoq_info_size_human(d->max, hi, sizeof hi);
      snprintf(buf, len, "%s%s%s to %s%s%s bytes%s%s%s%s", q, lo, q, q, hi, q, d->choices != NULL ? ", or " : "",
               d->choices != NULL ? q : "", d->choices != NULL ? d->choices : "", d->choices != NULL ? q : "");
      break;
    case AGOQ_PARAM_TYPE_BOOL:
      snprintf(buf, len, "%s", markdown ? "`0`/`1`, `true`/`false`, `yes`/`no`, `on`/`off`"
                                        : "0/1, true/false, yes/no, on/off");
      break;
    case AGOQ_PARAM_TYPE_ENUM: {
      /* "a|b|c" becomes "a, b, c" (with code spans in Markdown, where '|' would split a cell). */
      size_t n = 0;
      buf[0] = '\0';
      for (const char* c = d->choices != NULL ? d->choices : ""; *c != '\0' && n + 8 < len;) {
        const char* bar = strchr(c, '|');
        int clen = bar != NULL ? (int)(bar - c) : (int)strlen(c);
        n += (size_t)snprintf(buf + n, len - n, "%s%s%.*s%s", n > 0 ? ", " : "", q, clen, c, q);
        if (bar == NULL || n >= len) break;
        c = bar + 1;
      }
      break;
    }
    case AGOQ_PARAM_TYPE_STRING:
      snprintf(buf, len, "up to %d characters", AGOQ_PARAM_STRING_MAX);
      break;
  }
}

/* The canonical reading of a valid value, when it says more than the text itself. */
static void agoq_info_meaning(const agoq_param_desc* d, const char* text, int64_t v, char* buf,
                              size_t len) {
  buf[0] = '\0';
  switch (d->type) {
    case AGOQ_PARAM_TYPE_INT: {
      char dec[32];
      snprintf(dec, sizeof dec, "%" PRId64, v);
      if (strcmp(dec, text) != 0) snprintf(buf, len, " (= %s)", dec);
      break;
    }
    case AGOQ_PARAM_TYPE_SIZE: {
      char dec[32];
      snprintf(dec, sizeof dec, "%" PRId64, v);
      if (v >= 0 && strcmp(dec, text) != 0) snprintf(buf, len, " (= %s bytes)", dec); /* < 0: a keyword */
      break;
    }
    case AGOQ_PARAM_TYPE_BOOL:
      if (strcmp(text, v ? "1" : "0") != 0) snprintf(buf, len, " (= %d)", (int)v);
      break;
    case AGOQ_PARAM_TYPE_ENUM:
    case AGOQ_PARAM_TYPE_STRING:
      break;
  }
}

/* ---- Variables outside the parameter table ---------------------------------------------- */

/* agoq_env_other.def: what agoq reads besides its parameters (NCCL's variables, the tools'). */
static const struct {
  const char* name;
  const char* read_by;
  const char* doc;
} agoq_info_env_other[] = {
#define AGOQ_ENV_OTHER(NAME, READ_BY, DOC) {NAME, READ_BY, DOC},
#include "core/agoq_env_other.def"
#undef AGOQ_ENV_OTHER
};
#define AGOQ_INFO_ENV_OTHER_COUNT (sizeof agoq_info_env_other / sizeof agoq_info_env_other[0])

static void agoq_info_env_other_text(FILE* out) {
  fprintf(out, "\nalso read (%d variables outside the parameter table; never validated as AGOQ_* "
               "parameters, read as described)\n",
          (int)AGOQ_INFO_ENV_OTHER_COUNT);
  for (size_t i = 0; i < AGOQ_INFO_ENV_OTHER_COUNT; i++) {
    const char* name = agoq_info_env_other[i].name;
    size_t nl = strlen(name);
    if (nl > 0 && name[nl - 1] == '*') {
      /* A family of names: show the members that are set. */
      fprintf(out, "\n%s\n    set:     ", name);
      int shown = 0;
      for (char** e = environ; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, nl - 1) == 0) fprintf(out, "%s%s", shown++ ? ", " : " ", *e);
      fprintf(out, "%s\n    read by:  %s\n", shown ? "" : " (none)", agoq_info_env_other[i].read_by);
      agoq_info_wrap(out, agoq_info_env_other[i].doc, 4, AGOQ_INFO_WIDTH);
      continue;
    }
    const char* v = getenv(name);
    fprintf(out, "\n%s\n    value:    %s\n    read by:  %s\n", name,
            v == NULL ? "(unset)" : *v == '\0' ? "(empty)" : v, agoq_info_env_other[i].read_by);
    agoq_info_wrap(out, agoq_info_env_other[i].doc, 4, AGOQ_INFO_WIDTH);
  }
}

/* ---- Text -------------------------------------------------------------------------------- */

/* One line each, never wrapped: the summary is five lines to read (or grep) at a glance. */
static void agoq_info_summary_line(FILE* out, const char* text) { fprintf(out, "  %s\n", text); }

/* An AGOQ_* name of the environment nobody reads (the plugin's init WARNed for it too). */
static void agoq_info_unknown_name(void* arg, const char* name, size_t len, const char* closest) {
  char line[256];
  snprintf(line, sizeof line, "UNKNOWN: %.*s is not an agoq setting and is ignored%s%s%s", (int)(len < 96 ? len : 96),
           name, closest != NULL ? "; did you mean " : "", closest != NULL ? closest : "", closest != NULL ? "?" : "");
  agoq_info_summary_line(arg, line);
}

/* What the plugin's init would put in effect, from the plugin's own configuration code
 * (agoq_net_config_load, agoq_coll_config_check): whatever init refuses, this refuses. */
static int agoq_info_config_summary(FILE* out, bool* init_fails) {
  ncclResult_t net = agoq_net_config_load();
  ncclResult_t coll = net == ncclSuccess ? agoq_coll_config_check() : net;
  fprintf(out, "agoq %s: what the plugin's init puts in effect (its own checks, run here)\n", AGOQ_VERSION_STRING);
  int bad = 0;
  if (net != ncclSuccess || coll != ncclSuccess) {
    char line[256];
    snprintf(line, sizeof line, "INIT FAILS: %s; the WARN lines on stderr say why, and NCCL would not load the plugin",
             agoq_result_str(net != ncclSuccess ? net : coll));
    agoq_info_summary_line(out, line);
    bad = 1;
    *init_fails = true;
  } else {
    agoq_effect e;
    agoq_net_effect_describe(&e);
    agoq_info_summary_line(out, e.transport);
    agoq_info_summary_line(out, e.gpu);
    agoq_info_summary_line(out, e.collnet);
    agoq_info_summary_line(out, e.p2p);
    agoq_info_summary_line(out, e.hardware);
  }
  if (agoq_params_unknown_each(agoq_info_unknown_name, out) > 0) bad = 1;
  return bad;
}

int agoq_info_config_text(FILE* out) {
  bool init_fails = false;
  int summary = agoq_info_config_summary(out, &init_fails);
  ncclResult_t load = agoq_params_load();
  int invalid = 0;
  fprintf(out, "\n%d parameters, read from the environment once per process\n", (int)AGOQ_PARAM_COUNT);
  for (int i = 0; i < AGOQ_PARAM_COUNT; i++) {
    agoq_param_id id = (agoq_param_id)i;
    const agoq_param_desc* d = agoq_param_describe(id);
    const char* source = agoq_param_source(id);
    const char* text = agoq_param_str(id);
    bool from_env = strcmp(source, "default") != 0;

    /* Re-parse what the variable holds, untruncated, to say why a load failed. */
    char err[512] = "";
    int64_t value = agoq_param_int(id);
    if (from_env) {
      const char* raw = getenv(source);
      agoq_param_desc named = *d;
      named.name = source;
      if (raw == NULL || agoq_param_parse(&named, raw, &value, err, sizeof err) != ncclSuccess) {
        if (err[0] == '\0') snprintf(err, sizeof err, "%s is no longer set", source);
        invalid++;
      }
    }

    char meaning[64] = "", allowed[256], def_meaning[64];
    int64_t def_value = 0;
    if (err[0] == '\0') agoq_info_meaning(d, text, value, meaning, sizeof meaning);
    def_meaning[0] = '\0';
    if (agoq_param_parse(d, d->default_value, &def_value, NULL, 0) == ncclSuccess)
      agoq_info_meaning(d, d->default_value, def_value, def_meaning, sizeof def_meaning);
    agoq_info_allowed(d, false, allowed, sizeof allowed);

    char where[160];
    if (!from_env)
      snprintf(where, sizeof where, "default");
    else if (d->nccl_fallback != NULL && strcmp(source, d->nccl_fallback) == 0)
      snprintf(where, sizeof where, "NCCL fallback %s", source);
    else
      snprintf(where, sizeof where, "env %s", source);

    fprintf(out, "\n%s (%s)\n", d->name, agoq_param_type_name(d->type));
    fprintf(out, "    value:    %s%s%s  [%s]\n", text[0] != '\0' ? text : "(empty)", meaning,
            err[0] != '\0' ? "  INVALID" : "", where);
    if (err[0] != '\0') fprintf(out, "    error:    %s\n", err);
    fprintf(out, "    default:  %s%s\n", d->default_value[0] != '\0' ? d->default_value : "(empty)",
            def_meaning);
    fprintf(out, "    allowed:  %s\n", allowed);
    if (d->nccl_fallback != NULL)
      fprintf(out, "    fallback: %s, read when %s is unset or empty\n", d->nccl_fallback,
              d->name);
    agoq_info_wrap(out, d->doc, 4, AGOQ_INFO_WIDTH);
  }
  agoq_info_env_other_text(out);
  if (load != ncclSuccess) {
    fprintf(stderr,
            "agoq-info: %s; NCCL would fail to initialise the plugin (ncclInvalidUsage)\n",
            invalid > 0 ? "invalid parameter value in the environment (see above)"
                        : "parameters failed to load");
    return 1;
  }
  /* Valid values can still select nothing: resolve the interfaces and ports as init does
   * (the interfaces not after a failed init: that would only repeat its TCP WARNs, and
   * blame the interface list for a refused congestion control). */
  int rc = 0;
  if (!init_fails) rc = agoq_info_config_interfaces(out);
  /* The verbs ports explain a failed init too (a bad AGOQ_IB_HCA, no RDMA device). */
  if (agoq_info_config_ports(out) != 0) rc = 1;
  if (summary != 0) {
    fprintf(stderr, "agoq-info: the configuration is not what was asked for (see the summary at the top)\n");
    rc = 1;
  }
  return rc;
}

/* ---- Markdown ---------------------------------------------------------------------------- */

/* Doc text as Markdown: variable names become code spans, and the few characters that
 * Markdown would read as markup are escaped. */
static void agoq_info_md_text(FILE* out, const char* text, bool in_table) {
  for (const char* p = text; *p != '\0';) {
    bool word_start = p == text || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
    if (word_start && (strncmp(p, "AGOQ_", 5) == 0 || strncmp(p, "NCCL_", 5) == 0)) {
      const char* e = p + 5;
      while (isupper((unsigned char)*e) || isdigit((unsigned char)*e) || *e == '_') e++;
      if (e > p + 5) {
        fprintf(out, "`%.*s`", (int)(e - p), p);
        p = e;
        continue;
      }
    }
    switch (*p) {
      case '*': case '\\': case '`': case '[': case ']': fprintf(out, "\\%c", *p); break;
      case '<': fputs("&lt;", out); break;
      case '|': fputs(in_table ? "\\|" : "|", out); break;
      default: fputc(*p, out); break;
    }
    p++;
  }
}

static void agoq_info_md_default(FILE* out, const agoq_param_desc* d) {
  if (d->default_value[0] == '\0')
    fputs("*(empty)*", out);
  else
    fprintf(out, "`%s`", d->default_value);
}

/* GitHub's anchor for a heading "`AGOQ_X`": lower case, code marks dropped. */
static void agoq_info_md_anchor(FILE* out, const char* name) {
  for (const char* p = name; *p != '\0'; p++) fputc(tolower((unsigned char)*p), out);
}

void agoq_info_config_markdown(FILE* out) {
  fputs("<!-- generated by agoq-info -c --markdown; do not edit. "
        "Regenerate with tools/gen-config-doc.sh BUILD_DIR -->\n\n",
        out);
  fputs("# Configuration\n\n", out);
  fputs("agoq is configured through `AGOQ_*` environment variables. They are read once per\n"
        "process, when NCCL first initialises the plugin; changing one later has no effect.\n\n",
        out);
  fputs("- An invalid value makes the plugin's init fail with `ncclInvalidUsage`, after a WARN\n"
        "  line that names the variable, the value and what is allowed. Nothing runs with a\n"
        "  value you did not ask for.\n"
        "- An empty value (`AGOQ_X=`) counts as unset.\n"
        "- Each value taken from the environment is logged as\n"
        "  `NET/AGOQ AGOQ_X set by environment to V.` under `NCCL_DEBUG=INFO` with\n"
        "  `NCCL_DEBUG_SUBSYS=ENV` (or `ALL`).\n"
        "- A few parameters honour an NCCL variable of identical meaning when the `AGOQ_*` one\n"
        "  is unset or empty; the tables below name it.\n"
        "- `agoq-info -c` prints every parameter with the value in effect and where it came\n"
        "  from.\n\n",
        out);

  fputs("## Value syntax\n\n", out);
  fputs("| Type | Accepted |\n|---|---|\n", out);
  fputs("| int | a decimal integer with an optional sign: `8`, `-1`, `+8`; no hexadecimal |\n", out);
  fputs("| size | bytes: a decimal number with an optional suffix `K`, `M`, `G` or `T` (powers of "
        "1024, any case), optionally followed by `B` or `iB`: `65536`, `64K`, `64KiB` |\n",
        out);
  fputs("| bool | `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case) |\n", out);
  fputs("| enum | one of the listed choices (any case) |\n", out);
  fprintf(out, "| string | any text up to %d characters |\n\n", AGOQ_PARAM_STRING_MAX);
  fputs("Blanks around a value are ignored; anything else after it is an error.\n\n", out);

  fputs("## Summary\n\n", out);
  fputs("| Variable | Type | Default | Allowed | NCCL fallback |\n|---|---|---|---|---|\n", out);
  for (int i = 0; i < AGOQ_PARAM_COUNT; i++) {
    const agoq_param_desc* d = agoq_param_describe((agoq_param_id)i);
    char allowed[256];
    agoq_info_allowed(d, true, allowed, sizeof allowed);
    fprintf(out, "| [`%s`](#", d->name);
    agoq_info_md_anchor(out, d->name);
    fprintf(out, ") | %s | ", agoq_param_type_name(d->type));
    agoq_info_md_default(out, d);
    fprintf(out, " | %s | ", allowed);
    if (d->nccl_fallback != NULL) fprintf(out, "`%s`", d->nccl_fallback);
    fputs(" |\n", out);
  }

  fputs("\n## Parameters\n", out);
  for (int i = 0; i < AGOQ_PARAM_COUNT; i++) {
    const agoq_param_desc* d = agoq_param_describe((agoq_param_id)i);
    char allowed[256];
    agoq_info_allowed(d, true, allowed, sizeof allowed);
    fprintf(out, "\n### `%s`\n\n", d->name);
    agoq_info_md_text(out, d->doc, false);
    fprintf(out, "\n\n- Type: %s\n- Default: ", agoq_param_type_name(d->type));
    agoq_info_md_default(out, d);
    fprintf(out, "\n- Allowed: %s\n", allowed);
    if (d->nccl_fallback != NULL)
      fprintf(out, "- NCCL fallback: `%s`, read when `%s` is unset or empty\n", d->nccl_fallback,
              d->name);
  }

  fputs("\n## Other variables agoq reads\n\n"
        "These are not `AGOQ_*` parameters: they are not validated at init and `agoq-info -c`\n"
        "lists them after the parameters with their current value. NCCL's own variables are\n"
        "read exactly as NCCL reads them.\n\n"
        "| Variable | Read by | How, and what it changes |\n|---|---|---|\n",
        out);
  for (size_t i = 0; i < AGOQ_INFO_ENV_OTHER_COUNT; i++) {
    fprintf(out, "| `%s` | ", agoq_info_env_other[i].name);
    agoq_info_md_text(out, agoq_info_env_other[i].read_by, true);
    fputs(" | ", out);
    agoq_info_md_text(out, agoq_info_env_other[i].doc, true);
    fputs(" |\n", out);
  }
}
