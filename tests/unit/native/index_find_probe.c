/* monarch_native.h's index look-up exported for tests/unit/native/test_index_find.py (built by it). */
#include "../../../monarch/native/monarch_native.h"

/* The number of ``key`` in the index ``x`` (``len`` bytes, the whole file), or 0; -1 if the
 * shim would not map it (monarch_index_bounded). */
EXPORT int64_t probe_find(const unsigned char *x, uint64_t len, const char *key, uint64_t klen)
{
    struct monarch_index_header h;
    if (len < sizeof h)
        return -1;
    memcpy(&h, x, sizeof h);
    if (!monarch_index_bounded(&h, len, h.files))
        return -1;
    monarch_crc_init();
    return klen & 1 ? monarch_index_find(x, &h, key, klen, monarch_crc32(key, klen)) : monarch_index_find_key(x, &h, key, klen);
}
