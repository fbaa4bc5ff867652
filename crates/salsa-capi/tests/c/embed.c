/*
 * A C program embedding a SALSA pool through salsa.h: every call of the C API, its errors, its
 * thread safety and durability across close and reopen. Run by tests/c_program.rs; prints what
 * failed and exits non-zero on the first broken expectation.
 */
#include "salsa.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(cond)                                                                       \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: expected %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
                    salsa_last_error());                                                   \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define OK(call) EXPECT((call) == 0)

enum { PAGE = 4096, THREADS = 4, PAGES_PER_THREAD = 64 };

static void fill(unsigned char *buf, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 12));
}

struct writer {
    SalsaVolume *vol;
    unsigned id;
    int rc;
};

/* Each thread writes its own pages through the one shared handle. */
static void *write_pages(void *arg) {
    struct writer *w = arg;
    unsigned char buf[PAGE];
    w->rc = 0;
    for (unsigned p = 0; p < PAGES_PER_THREAD && w->rc == 0; p++) {
        unsigned page = w->id * PAGES_PER_THREAD + p;
        fill(buf, PAGE, page);
        w->rc = salsa_write(w->vol, (uint64_t)page * PAGE, buf, PAGE);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DEVICE_SPEC\n", argv[0]);
        return 2;
    }
    const char *devices[] = {argv[1]};
    SalsaPool *pool = NULL;
    SalsaVolume *db = NULL, *log = NULL;
    unsigned char buf[2 * PAGE], back[2 * PAGE];

    /* Bad arguments are errors with a message, never crashes. */
    EXPECT(salsa_pool_open(NULL, 1, &pool) == -EINVAL);
    EXPECT(strstr(salsa_last_error(), "no devices") != NULL);
    EXPECT(salsa_read(NULL, 0, buf, PAGE) == -EINVAL);
    EXPECT(strstr(salsa_last_error(), "NULL") != NULL);

    OK(salsa_pool_create(devices, 1, 1 << 20, &pool));
    EXPECT(strcmp(salsa_last_error(), "") == 0);
    /* A second pool on the same (now formatted) device is refused. */
    SalsaPool *again = NULL;
    EXPECT(salsa_pool_create(devices, 1, 0, &again) < 0 && again == NULL);

    OK(salsa_volume_create(pool, "db", 16 << 20, NULL, 0, 0, &db));
    EXPECT(salsa_volume_size(db) == 16 << 20);
    EXPECT(salsa_volume_page_bytes(db) == PAGE);
    EXPECT(salsa_volume_segment_bytes(db) == 0);
    EXPECT(salsa_volume_create(pool, "db", 1 << 20, NULL, 0, 0, &log) == -EEXIST);
    EXPECT(salsa_volume_create(pool, "x", 1 << 20, "btree", 0, 0, &log) == -EINVAL);
    EXPECT(strstr(salsa_last_error(), "unknown controller") != NULL);

    /* Write, read back, partial pages, zeros, trim. */
    fill(buf, sizeof buf, 1);
    OK(salsa_write(db, 3 * PAGE, buf, sizeof buf));
    OK(salsa_read(db, 3 * PAGE, back, sizeof back));
    EXPECT(memcmp(buf, back, sizeof buf) == 0);
    OK(salsa_write(db, 3 * PAGE + 100, "salsa", 5));
    OK(salsa_read(db, 3 * PAGE + 98, back, 9));
    EXPECT(memcmp(back + 2, "salsa", 5) == 0 && back[0] == buf[98] && back[8] == buf[106]);
    OK(salsa_read(db, 100 * PAGE, back, PAGE));
    for (int i = 0; i < PAGE; i++) EXPECT(back[i] == 0);
    OK(salsa_trim(db, 4 * PAGE, PAGE));
    OK(salsa_read(db, 4 * PAGE, back, PAGE));
    for (int i = 0; i < PAGE; i++) EXPECT(back[i] == 0);
    OK(salsa_write_zeroes(db, 3 * PAGE, 10));
    OK(salsa_read(db, 3 * PAGE, back, 12));
    EXPECT(back[9] == 0 && back[10] == buf[10]);
    EXPECT(salsa_read(db, (16 << 20) - 1, back, 2) == -EINVAL);
    EXPECT(strstr(salsa_last_error(), "past the end") != NULL);
    OK(salsa_write_fua(db, 0, buf, PAGE));

    /* Share: page 3..5 appear at 200..202 without a copy; a source overwritten later leaves
       the copy as it was; bad batches change nothing. */
    OK(salsa_read(db, 3 * PAGE, buf, 2 * PAGE));
    SalsaShareRange ranges[] = {{200 * PAGE, 3 * PAGE, 2 * PAGE}, {300 * PAGE, 0, PAGE}};
    OK(salsa_share(db, ranges, 2));
    OK(salsa_read(db, 200 * PAGE, back, 2 * PAGE));
    EXPECT(memcmp(buf, back, 2 * PAGE) == 0);
    unsigned char zero[PAGE] = {0};
    OK(salsa_write(db, 3 * PAGE, zero, PAGE));
    OK(salsa_read(db, 200 * PAGE, back, PAGE));
    EXPECT(memcmp(buf, back, PAGE) == 0);
    SalsaShareRange overlapping[] = {{400 * PAGE, 0, 2 * PAGE}, {401 * PAGE, 0, PAGE}};
    EXPECT(salsa_share(db, overlapping, 2) == -EINVAL);
    EXPECT(strstr(salsa_last_error(), "overlapping") != NULL);
    SalsaShareRange partial[] = {{400 * PAGE + 1, 0, PAGE}};
    EXPECT(salsa_share(db, partial, 1) == -EINVAL);
    EXPECT(salsa_share(db, NULL, 1) == -EINVAL);
    OK(salsa_read(db, 400 * PAGE, back, 2 * PAGE));
    for (int i = 0; i < 2 * PAGE; i++) EXPECT(back[i] == 0);
    /* Restore page 3 for the checks below. */
    OK(salsa_write(db, 3 * PAGE, buf, PAGE));
    OK(salsa_read(db, 0, buf, PAGE));

    /* Several threads through one handle. */
    pthread_t threads[THREADS];
    struct writer writers[THREADS];
    for (unsigned t = 0; t < THREADS; t++) {
        writers[t] = (struct writer){db, t + 1, 0};
        EXPECT(pthread_create(&threads[t], NULL, write_pages, &writers[t]) == 0);
    }
    for (unsigned t = 0; t < THREADS; t++) {
        EXPECT(pthread_join(threads[t], NULL) == 0);
        OK(writers[t].rc);
    }
    OK(salsa_flush(db));

    /* An append-only volume: appends at the write point, overwrites and partial trims refused. */
    OK(salsa_volume_create(pool, "log", 8 << 20, "amf", 0, 1 << 20, &log));
    EXPECT(salsa_volume_segment_bytes(log) == 1 << 20);
    uint64_t at = 1, wp = 1;
    OK(salsa_amf_write_point(log, 2, &wp));
    EXPECT(wp == 0);
    OK(salsa_amf_append(log, 2, buf, PAGE, &at));
    EXPECT(at == 2 << 20);
    OK(salsa_amf_append(log, 2, buf + PAGE, PAGE, &at));
    EXPECT(at == (2 << 20) + PAGE);
    OK(salsa_amf_write_point(log, 2, &wp));
    EXPECT(wp == 2 * PAGE);
    EXPECT(salsa_write(log, 2 << 20, buf, PAGE) == -EPERM);
    EXPECT(salsa_trim(log, 2 << 20, PAGE) == -EINVAL);
    EXPECT(salsa_amf_write_point(db, 0, &wp) == -EINVAL);
    SalsaShareRange on_log[] = {{4 << 20, 2 << 20, PAGE}};
    EXPECT(salsa_share(log, on_log, 1) == -EINVAL);
    OK(salsa_read(log, 2 << 20, back, 2 * PAGE));
    EXPECT(memcmp(buf, back, 2 * PAGE) == 0);
    OK(salsa_pool_flush(pool));

    /* The pool outlives its volume handles. */
    EXPECT(salsa_pool_close(pool) == -EBUSY);
    salsa_volume_free(db);
    salsa_volume_free(log);
    salsa_volume_free(NULL);
    OK(salsa_pool_close(pool));

    /* Everything is there after reopening. */
    OK(salsa_pool_open(devices, 1, &pool));
    EXPECT(salsa_volume_open(pool, "nope", &db) == -ENOENT);
    OK(salsa_volume_open(pool, "db", &db));
    OK(salsa_volume_open(pool, "log", &log));
    OK(salsa_read(db, 0, back, PAGE));
    EXPECT(memcmp(buf, back, PAGE) == 0);
    for (unsigned page = PAGES_PER_THREAD; page < (THREADS + 1) * PAGES_PER_THREAD; page++) {
        unsigned char want[PAGE];
        fill(want, PAGE, page);
        OK(salsa_read(db, (uint64_t)page * PAGE, back, PAGE));
        EXPECT(memcmp(want, back, PAGE) == 0);
    }
    OK(salsa_amf_write_point(log, 2, &wp));
    EXPECT(wp == 2 * PAGE);
    OK(salsa_trim(log, 2 << 20, 1 << 20));
    OK(salsa_amf_write_point(log, 2, &wp));
    EXPECT(wp == 0);
    salsa_volume_free(db);
    salsa_volume_free(log);
    OK(salsa_pool_close(pool));
    printf("c api: all checks passed\n");
    return 0;
}
