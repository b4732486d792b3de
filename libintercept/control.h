/* The control thread: the shim's side of protocol v1 with gpucrd
 * (proto/rpc.proto), one per process.
 *
 * Started by the first cuInit or the first chunk of device memory gpucr
 * creates, whichever comes first; never with GPUCR_DAEMON=0. It connects to
 * sock_default_path() ($GPUCR_SOCKET or /run/gpucr/gpucrd.sock), says Hello
 * (with its thread id, the one the CRIU plugin wakes), reports every chunk
 * of gpucr's device memory (BufferAdd with the chunk's fd, BufferFree) and
 * obeys the daemon's quiesce, release, remap and resume. Resume{save_epoch}
 * (a concurrent checkpoint) runs the process in a save epoch (epoch.h):
 * calls that would write chunks gpucrd has not saved wait at the per-chunk
 * gate, the thread asks gpucrd for them (ChunksWanted) and lets them go as
 * gpucrd says they are saved (ChunksSaved); a new quiesce or the connection
 * closing ends the epoch and lets every call go. ChunksSaved{escaped} (a
 * saved chunk changed: a write escaped prediction) ends it too and is
 * answered with the Suspects, the functions it let run, which are held in
 * every later epoch (suspect.h); ShimStats counts them. Without a daemon
 * the application runs as if gpucr were not there, and the thread tries
 * again every 2 s.
 *
 * Application threads never wait on the daemon: they only ring
 * control_kick(), and the control thread exports and sends on its own time.
 * The control thread calls the driver through `real` only and is exempt
 * from the gate.
 *
 * Environment:
 *   GPUCR_DAEMON=0          never connect (the gate then never closes)
 *   GPUCR_SOCKET=PATH       the daemon's socket
 *   GPUCR_WAKE_SIGNAL=N     the signal number that wakes the thread after a
 *                           restore (default SIGRTMIN+11, as glibc numbers it;
 *                           common/sock.h gpucr_wake_signal())
 *   GPUCR_RECONNECT_MS=N    retry period (default 2000; 1000 once memory is
 *                           released, woken early by the wake signal)
 *   GPUCR_QUIESCE_GRACE_MS=N  pause between the two drains of a quiesce
 *                           (default 2; see control.c) */
#ifndef GPUCR_CONTROL_H
#define GPUCR_CONTROL_H

#include "shim.h"

/* Starts the control thread if the process has none yet. Any thread; a load
 * and a branch once started. Never blocks on the daemon. */
void control_start(void) SHIM_HIDDEN;

/* Chunks of gpucr's memory were created or destroyed: the control thread
 * reports them when connected. Called under alloc's lock; never blocks.
 * Starts the thread if needed (the first chunk of the process). */
void control_kick(void) SHIM_HIDDEN;

#endif
