"""The job worker: claims gates from the Postgres queue and judges them in the sandbox."""
