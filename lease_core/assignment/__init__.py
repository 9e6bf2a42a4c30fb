"""The pure assignment deciders (KCL's variance and count, our makespan) over a snapshot."""
