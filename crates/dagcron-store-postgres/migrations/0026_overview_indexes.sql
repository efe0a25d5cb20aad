-- The runs browser lists a namespace's runs newest first: by namespace,
-- then id, without a sort. Both columns never change after the insert, so
-- updates of a run stay heap-only.
CREATE INDEX runs_by_namespace ON runs (namespace, id DESC);

-- The overview lists a namespace's fires that made no run on time, newest
-- first: few rows (most fires fire), and an outcome never changes once
-- recorded.
CREATE INDEX fires_not_made ON fires (namespace, scheduled_at DESC)
    WHERE outcome <> 'fired' AND outcome <> 'suppressed';
