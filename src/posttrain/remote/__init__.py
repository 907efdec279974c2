"""Remote-call plumbing for Ray actors: where an actor's process is and its stacks (stacks.py), the chaos hook for
recovery tests (faults.py), bounded waits and hang detection (watchdog.py), and redoing a dead worker's share
(redo.py). A bottom layer: from posttrain it imports only tracking.interruptions and preemption (which imports
nothing from posttrain); errors would be allowed too. Every worker layer imports it, never the other way round."""
