"""State the evaluation reads: the turns of each conversation (:mod:`.session`, in
memory or Redis) and the ground truth for known questions (:mod:`.reference`, from a
JSONL or YAML file)."""
