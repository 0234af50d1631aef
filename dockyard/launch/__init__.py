"""Slurm launch: plan the het job, render it through submitit, and run it inside the allocation."""
