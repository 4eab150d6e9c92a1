/* A bounded text builder shared by the port facts' describers (agoq_ibport.c,
 * agoq_ibport_gid.c): appends never overflow and the text stays NUL-terminated. */
#ifndef AGOQ_IBPORT_TEXT_H
#define AGOQ_IBPORT_TEXT_H

#include <stddef.h>

typedef struct {
  char* p;
  size_t n;
  size_t len; /* what the whole text needs, even past n */
} agoq_ib_text;

__attribute__((format(printf, 2, 3))) void agoq_ib_text_add(agoq_ib_text* t, const char* fmt, ...);

#endif
