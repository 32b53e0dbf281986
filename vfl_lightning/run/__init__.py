"""One run, job by job: checks before anything is built, assembly, the Ray session, results and
the outcome (status, exit code); ``run.train.train`` reads them top to bottom."""
