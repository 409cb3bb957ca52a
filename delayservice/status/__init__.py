"""What is waiting and where one message is: the operator's views (`pending`, `find`)."""
