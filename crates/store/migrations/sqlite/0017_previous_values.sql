-- "Compensate with the same tool and the previous values": the values a write tool's declared
-- read (`compensate_with`) answered just before the call, as JSON ({input: previous value}),
-- kept with the step so aborting its run can set them back with the same tool.
ALTER TABLE steps ADD COLUMN previous TEXT;
