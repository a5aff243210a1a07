"""What the scheduler says: Events, the PodScheduled condition and the notes about refusals, lost nodes and recreated pods."""
