"""Job runner (Celery workers, SQL records, artifacts): a thin shell over ``core``. Not built yet."""
