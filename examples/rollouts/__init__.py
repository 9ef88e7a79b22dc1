"""Gating a rollout on ragtrace scores: an Argo Rollouts AnalysisTemplate and a script
for any other deploy tool (docs/rollouts.md)."""
