"""The run itself: config and sheets to groups, the stages of a group, the stage
scheduler, writing a group, the backends' agreement, and single renders for the speech service."""
