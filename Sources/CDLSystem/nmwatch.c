// NetworkManager's metered state over D-Bus, with sd-bus from libsystemd.so.0 opened at run
// time. The few sd-bus functions used are declared here (their ABI is stable since systemd
// 221; sd_bus_match_signal is not used, sd_bus_add_match with a rule string is older), so that
// the build needs no libsystemd-dev.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cdlsystem.h"

typedef struct sd_bus sd_bus;
typedef struct sd_bus_slot sd_bus_slot;
typedef struct sd_bus_message sd_bus_message;
typedef struct {
    const char *name;
    const char *message;
    int _need_free;
} sd_bus_error;
typedef int (*sd_bus_message_handler_t)(sd_bus_message *m, void *userdata, sd_bus_error *ret_error);

#define NM_NAME "org.freedesktop.NetworkManager"
#define NM_PATH "/org/freedesktop/NetworkManager"

struct dld_nm_watch {
    sd_bus *bus;
    /// A signal asked for `Metered` to be read again.
    int dirty;
    int metered;
    int (*open_system)(sd_bus **ret);
    int (*add_match)(sd_bus *bus, sd_bus_slot **slot, const char *match, sd_bus_message_handler_t callback, void *userdata);
    int (*get_property_trivial)(sd_bus *bus, const char *destination, const char *path, const char *interface,
                                const char *member, sd_bus_error *ret_error, char type, void *ret_ptr);
    int (*get_fd)(sd_bus *bus);
    int (*get_events)(sd_bus *bus);
    int (*process)(sd_bus *bus, sd_bus_message **ret);
    int (*flush)(sd_bus *bus);
    sd_bus *(*flush_close_unref)(sd_bus *bus);
    void (*error_free)(sd_bus_error *e);
};

/// Any matched signal only marks the state for a fresh read: nothing in the signal's body is
/// trusted or parsed, so a signal sent by another peer can cost a read, never a wrong state.
static int dld_nm_signal(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
    (void)m;
    (void)ret_error;
    ((dld_nm_watch *)userdata)->dirty = 1;
    return 0;
}

static void dld_nm_read(dld_nm_watch *w) {
    sd_bus_error error = {NULL, NULL, 0};
    uint32_t value = 0;
    int r = w->get_property_trivial(w->bus, NM_NAME, NM_PATH, NM_NAME, "Metered", &error, 'u', &value);
    w->error_free(&error);
    w->metered = r < 0 ? -1 : (value > INT32_MAX ? 0 : (int)value);
}

#define LOAD(field, symbol)                                                              \
    do {                                                                                 \
        *(void **)(&w->field) = dlsym(lib, symbol);                                      \
        if (w->field == NULL) {                                                          \
            snprintf(why, why_size, "libsystemd.so.0 has no %s (too old)", symbol);      \
            free(w);                                                                     \
            return NULL;                                                                 \
        }                                                                                \
    } while (0)

dld_nm_watch *dld_nm_open(char *why, unsigned long why_size) {
    if (why_size > 0) why[0] = 0;
    // Kept loaded for the life of the process: a later watch finds it there.
    void *lib = dlopen("libsystemd.so.0", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *error = dlerror();
        snprintf(why, why_size, "cannot load libsystemd.so.0: %s", error ? error : "unknown error");
        return NULL;
    }
    dld_nm_watch *w = calloc(1, sizeof *w);
    if (w == NULL) {
        snprintf(why, why_size, "out of memory");
        return NULL;
    }
    LOAD(open_system, "sd_bus_open_system");
    LOAD(add_match, "sd_bus_add_match");
    LOAD(get_property_trivial, "sd_bus_get_property_trivial");
    LOAD(get_fd, "sd_bus_get_fd");
    LOAD(get_events, "sd_bus_get_events");
    LOAD(process, "sd_bus_process");
    LOAD(flush, "sd_bus_flush");
    LOAD(flush_close_unref, "sd_bus_flush_close_unref");
    LOAD(error_free, "sd_bus_error_free");
    w->metered = -1;
    int r = w->open_system(&w->bus);
    if (r < 0) {
        snprintf(why, why_size, "cannot connect to the system bus: %s", strerror(-r));
        free(w);
        return NULL;
    }
    // Subscribed before the first read, so that no change falls between the two. Floating
    // matches (no slot kept): they go with the bus.
    const char *rules[] = {
        "type='signal',path='" NM_PATH "',interface='org.freedesktop.DBus.Properties',"
        "member='PropertiesChanged',arg0='" NM_NAME "'",
        "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',"
        "interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='" NM_NAME "'",
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        r = w->add_match(w->bus, NULL, rules[i], dld_nm_signal, w);
        if (r < 0) {
            snprintf(why, why_size, "cannot subscribe to NetworkManager's signals: %s", strerror(-r));
            w->flush_close_unref(w->bus);
            free(w);
            return NULL;
        }
    }
    dld_nm_read(w);
    // Signals that came during the calls above wait in sd-bus's queue, not on the socket:
    // the caller's first `dld_nm_process` handles them.
    w->dirty = 0;
    return w;
}

int dld_nm_metered(const dld_nm_watch *watch) { return watch->metered; }

int dld_nm_fd(const dld_nm_watch *watch) { return watch->get_fd(watch->bus); }

int dld_nm_process(dld_nm_watch *w) {
    for (;;) {
        int r;
        while ((r = w->process(w->bus, NULL)) > 0) {}
        if (r < 0) return r;
        if (!w->dirty) break;
        // The read is a blocking call: signals that arrive meanwhile are queued and handled
        // by the next round of the loop.
        w->dirty = 0;
        dld_nm_read(w);
    }
    // Writes are small (method calls) and normally sent at once; what a full socket left
    // behind is sent now rather than waiting for a wake-up that only reads would bring.
    int events = w->get_events(w->bus);
    if (events > 0 && (events & POLLOUT)) {
        int r = w->flush(w->bus);
        if (r < 0) return r;
    }
    return 0;
}

void dld_nm_close(dld_nm_watch *watch) {
    if (watch == NULL) return;
    watch->flush_close_unref(watch->bus);
    free(watch);
}
