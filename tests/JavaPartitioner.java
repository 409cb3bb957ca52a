// Prints the partition the Java producer's default partitioner picks for each key:
// args are the partition count, then UTF-8 keys. Run with kafka-clients on the classpath.
import java.nio.charset.StandardCharsets;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;

public class JavaPartitioner {
    public static void main(String[] args) {
        int partitions = Integer.parseInt(args[0]);
        for (int i = 1; i < args.length; i++) {
            byte[] key = args[i].getBytes(StandardCharsets.UTF_8);
            System.out.println(BuiltInPartitioner.partitionForKey(key, partitions));
        }
    }
}
