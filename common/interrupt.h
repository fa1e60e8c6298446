// Graceful interrupts: SIGINT (Ctrl-C) and SIGTERM (SLURM preemption,
// torchrun's shutdown, `kill`) ask a training run to stop at the end of the
// current step, with a checkpoint there, instead of losing the work since the
// last one. A second signal stops at once.
//
// Note [Graceful interrupts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
//  * Who listens: `pipeforge train` only, the launcher and every rank
//    (installInterruptHandlers). Other commands keep the default: Ctrl-C ends
//    them at once, as a user expects of a split or an eval.
//  * Explicitly installed: a process started in the background by a script
//    inherits SIGINT as ignored, and exec keeps it ignored; installing the
//    handler is what makes `kill -INT` reach such a launcher and its ranks.
//  * One decision for all ranks: each rank records the signal it got; the
//    trainer adds the record to the step's one collective of checks, so every
//    rank learns after the same step that some rank was interrupted, and all
//    stop there and write that step's checkpoint (the run's `end` becomes that
//    step, as --stop-after would make it).
//  * The launcher relays: `kill -INT <launcher>` reaches only the launcher,
//    which sends the same signal once to each rank. Ctrl-C on a terminal
//    reaches the launcher and the ranks (one process group), so a rank then
//    gets the signal twice, once from the terminal and once relayed; torchrun
//    relays likewise. A signal sent by the process's own parent after the
//    first is therefore a relay, not a second request. Any other second
//    signal (Ctrl-C pressed again, a second `kill`) ends the process at once
//    with the default action, and a launcher that ends so takes its ranks
//    with it (they die with their parent).
//  * Exit status: 128 + the signal, as a shell reports a process it ended
//    (130 for SIGINT, 143 for SIGTERM), after the checkpoint is committed.
// Signals are the one process-wide state Pipeforge keeps: a handler can only
// reach a global.
#pragma once

namespace pipeforge {

// Installs the SIGINT and SIGTERM handlers described above. Idempotent.
void installInterruptHandlers();

// The first SIGINT or SIGTERM received since installInterruptHandlers, or 0.
int interruptSignal();

// "SIGINT", "SIGTERM", or "signal N".
const char* interruptSignalName(int signal);

// The status of a process that stopped because of `signal`: 128 + signal.
constexpr int interruptedExitStatus(int signal) { return 128 + signal; }

// Whether `status` is what a process interrupted by SIGINT or SIGTERM exits with.
bool isInterruptedExitStatus(int status);

}  // namespace pipeforge
