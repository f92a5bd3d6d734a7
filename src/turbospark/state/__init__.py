"""What the Responses API promises to keep: stored responses (their input
and output items, chains by ``previous_response_id``) and conversations, in
one SQLite file on a worker thread. No HTTP types; imports nothing else of
turbospark."""
